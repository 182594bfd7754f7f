"""The emulated cluster (``fleet.emulated``): three Ray nodes in namespaces of their own on this host, pinned work
lands where it is pinned, a killed node dies as a unit and Ray says so, a partitioned node is cut off while alive,
a fresh node joins, and nothing the cluster made outlives it, also when the code inside it raises."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verl_laminar.fleet import emulated_host as host
from verl_laminar.fleet.emulated import EmulatedCluster, unavailable
from verl_laminar.fleet.emulated_spec import ClusterSpec, NodeSpec

needs_host = pytest.mark.skipif(bool(unavailable()), reason=unavailable() or "ok")


def _ours(cluster_id: str) -> dict[str, list[str]]:
    """Everything on the host that names this cluster: namespaces, links, mounts, cgroups, folders."""
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    ctl = host.detect_cpu_control()
    cg = ctl.cluster_dir(cluster_id)
    return {
        "netns": [n for n in host.netns_list() if n.startswith(cluster_id)],
        "links": [line for line in links.splitlines() if cluster_id in line],
        "mounts": [line for line in Path("/proc/mounts").read_text().splitlines() if cluster_id in line],
        "cgroups": [str(cg)] if cg is not None and cg.exists() else [],
    }


def _assert_nothing_left(c: EmulatedCluster, pidns: list[str]) -> None:
    assert _ours(c.id) == {"netns": [], "links": [], "mounts": [], "cgroups": []}
    assert not c.root.exists()
    for ns in pidns:
        assert host.pidns_members(ns) == [], f"processes of PID namespace {ns} outlived stop()"


@needs_host
@pytest.mark.e2e
def test_three_nodes_kill_partition_add_and_nothing_left(tmp_path):
    t0 = time.monotonic()
    spec = ClusterSpec(rate_mbit=1000.0, base_dir=str(tmp_path))
    c = EmulatedCluster(spec, [NodeSpec("head"), NodeSpec("w1", cpu_limit=0.5), NodeSpec("w2")])
    pidns: list[str] = []
    with pytest.raises(RuntimeError, match="raised inside the cluster"):
        with c:
            pidns = [n.pidns for n in c.nodes.values()]
            assert len(set(pidns)) == 3 and host.pidns_of(os.getpid()) not in pidns
            seen = c.probe("nodes", "--alive", "3", "--timeout-s", "60")
            assert seen["ok"], seen
            ips = {n["ip"] for n in seen["nodes"] if n["alive"]}
            assert ips == {c.nodes[n].ip for n in ("head", "w1", "w2")} and len(ips) == 3
            # the driver runs in the head: its own PID namespace, not the host's
            assert seen["driver"]["pidns"] == c.nodes["head"].pidns

            where = c.probe("where", "--resource", "laminar_node_w1")
            assert where["ip"] == c.nodes["w1"].ip and where["hostname"] == "w1"
            assert where["pidns"] == c.nodes["w1"].pidns and where["pid"] < 10_000
            assert not Path(where["shm_file"]).exists(), "the node's /dev/shm is the host's"
            assert (c.nodes["w1"].folder / "tmp" / "ray").is_dir()  # its /tmp is the folder on disk
            if c.cpu_control.kind != "shared":  # every process of the node was born in its cgroup
                cg = c.nodes["w1"].cgroup
                assert set(host.pidns_members(c.nodes["w1"].pidns)) <= {int(p) for p in (cg / "cgroup.procs").read_text().split()}
                quota = (cg / ("cpu.max" if c.cpu_control.kind == "v2" else "cpu.cfs_quota_us")).read_text()
                assert quota.split()[0] == "50000"

            # partition: w2 unreachable from the head while its processes run; heal: reachable again
            w2_pids = host.pidns_members(c.nodes["w2"].pidns)
            assert c.reachable("head", "w2")
            c.partition("w2")
            assert not c.reachable("head", "w2", timeout_s=0.5)
            assert all(host.pidns_of(p) == c.nodes["w2"].pidns for p in w2_pids), "partition ended processes"
            c.heal("w2")
            assert c.reachable("head", "w2", timeout_s=5.0)

            # machine loss: every process of w1 ends at once, and Ray declares the node dead in bounded time
            w1_ip, w1_ns = c.nodes["w1"].ip, c.nodes["w1"].pidns
            killed = c.kill_node("w1")
            assert len(killed) >= 3  # PID 1, ray start, raylet and its agents
            assert host.pidns_members(w1_ns) == [] and all(not Path(f"/proc/{p}").exists() for p in killed)
            assert "w1" not in c.nodes and not any(n.startswith(f"{c.id}-w1") for n in host.netns_list())
            dead = c.probe("nodes", "--alive", "2", "--dead", w1_ip, "--timeout-s", "30")
            assert dead["ok"], dead
            assert {n["ip"] for n in dead["nodes"] if not n["alive"]} == {w1_ip}

            # a fresh node joins (the killed one's name, a new address)
            w1b = c.add_node(NodeSpec("w1"))
            assert w1b.ip != w1_ip
            joined = c.probe("nodes", "--alive", "3", "--timeout-s", "60")
            assert joined["ok"] and w1b.ip in {n["ip"] for n in joined["nodes"] if n["alive"]}, joined
            pidns.append(w1b.pidns)
            raise RuntimeError("raised inside the cluster")
    _assert_nothing_left(c, pidns)
    assert time.monotonic() - t0 < 240  # a bound, not the target (~40 s on 2 shared cores)


@needs_host
def test_sweep_removes_only_dead_owners_leftovers(tmp_path):
    # a pid that surely ended: a child that exited and was reaped
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale, live, other = f"lmemu{gone.pid}x0-node", f"lmemu{os.getpid()}x999-node", f"lmemutest{os.getpid()}"
    (tmp_path / f"lmemu{gone.pid}x0").mkdir()
    (tmp_path / f"lmemu{os.getpid()}x999").mkdir()
    made = []
    try:
        for name in (stale, live, other):
            subprocess.run(["ip", "netns", "add", name], check=True)
            made.append(name)
        removed = host.sweep(str(tmp_path))
        names = host.netns_list()
        assert stale not in names and live in names and other in names
        assert not (tmp_path / f"lmemu{gone.pid}x0").exists() and (tmp_path / f"lmemu{os.getpid()}x999").exists()
        assert f"netns {stale}" in removed
    finally:
        for name in made:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


_CRASHING_OWNER = """
import json, sys, time
from verl_laminar.fleet.emulated import EmulatedCluster
from verl_laminar.fleet.emulated_spec import ClusterSpec, NodeSpec
c = EmulatedCluster(ClusterSpec(base_dir=sys.argv[1]), [NodeSpec("head")]).start()
print(json.dumps({"id": c.id, "pidns": c.head.pidns}), flush=True)
time.sleep(600)
"""


@needs_host
@pytest.mark.e2e
def test_sweep_ends_a_crashed_owners_cluster(tmp_path):
    # the owner dies by SIGKILL (no finally, no atexit): its node keeps running until a later sweep
    owner = subprocess.Popen([sys.executable, "-c", _CRASHING_OWNER, str(tmp_path)], stdout=subprocess.PIPE,
                             text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        made = json.loads(owner.stdout.readline() or "{}")
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    assert made, "the owner did not start its cluster"
    try:
        assert host.pidns_members(made["pidns"]) and _ours(made["id"])["netns"]
        removed = host.sweep(str(tmp_path))
        assert any(made["id"] in r for r in removed)
        assert host.wait_gone(made["pidns"], 10.0) == []
        assert _ours(made["id"]) == {"netns": [], "links": [], "mounts": [], "cgroups": []}
        assert not (tmp_path / made["id"]).exists()
    finally:
        host.sweep(str(tmp_path))


def test_names_and_specs():
    assert host.owner_of("lmemu123x4-w1") == 123 and host.owner_of("lmemu123x4-sw") == 123
    assert host.owner_of("lmemu123x4") == 123
    for other in ("lmr123r0", "lmemutest1", "lmemu12-w1", "xlmemu1x2-w1", "lmemu1x2-W1"):
        assert host.owner_of(other) is None, other
    with pytest.raises(ValueError, match="lowercase"):
        NodeSpec("Head")
    with pytest.raises(ValueError, match="'sw' is the bridge"):
        NodeSpec("sw")
    with pytest.raises(ValueError, match="raise shm_mb"):
        NodeSpec("w1", shm_mb=64, object_store_mb=128)
    with pytest.raises(ValueError, match="distinct"):
        EmulatedCluster(ClusterSpec(), [NodeSpec("a"), NodeSpec("a")])
