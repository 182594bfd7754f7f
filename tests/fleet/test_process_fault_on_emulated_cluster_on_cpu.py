"""Issue 40's "done when": on the emulated cluster (head + 2 workers, each node its own PID namespace), a process
fault aimed at a replica on another node hits that replica and nothing else.

A stand-in replica (a server actor with a child process, as vLLMHttpServer and its engine core, plus a worker
actor) runs on w1, an identical decoy on w2 and one on the head; the driver runs in the head and kills the w1
replica through the product's ``trainer.procs.kill_replica``. The host, which sees every node's processes, checks
the effect independently of what the kill reports: the w1 server, worker and engine are gone, every decoy process
and every raylet still runs. A kill by the PID read inside the actor, from the head, would have signalled the
head's process of that number (or none) instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verl_laminar.fleet import emulated_host as host
from verl_laminar.fleet.emulated import EmulatedCluster, unavailable
from verl_laminar.fleet.emulated_spec import ClusterSpec, NodeSpec

needs_host = pytest.mark.skipif(bool(unavailable()), reason=unavailable() or "ok")
DRIVER = Path(__file__).with_name("emulated_fault_driver.py")


def _processes(pidns: str) -> dict[int, dict]:
    """{PID inside the node: {host pid, command line}} of the node's processes (NSpid: a PID per namespace level)."""
    out = {}
    for pid in host.pidns_members(pidns):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (FileNotFoundError, ProcessLookupError):
            continue
        state = next(line.split()[1] for line in status.splitlines() if line.startswith("State:"))
        if state == "Z":
            continue  # ended, waiting for its reaper
        nspid = next(line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:"))
        out[int(nspid[-1])] = {"host_pid": pid, "cmd": cmd}
    return out


def _read_json(proc: subprocess.Popen, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("{"):
            return json.loads(line)
    raise AssertionError(f"the driver printed no JSON (exit {proc.poll()}): {proc.stderr.read()[-3000:]}")


@needs_host
@pytest.mark.e2e
def test_a_process_fault_hits_the_replica_on_its_node_and_nothing_else(tmp_path):
    t0 = time.monotonic()
    spec = ClusterSpec(base_dir=str(tmp_path))
    with EmulatedCluster(spec, [NodeSpec("head"), NodeSpec("w1"), NodeSpec("w2")]) as c:
        assert c.probe("nodes", "--alive", "3", "--timeout-s", "60")["ok"]
        env = {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        driver = c.head_popen([sys.executable, str(DRIVER), "w1", "w2", "head"], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            started = _read_json(driver, 180)["started"]
            before = {name: _processes(c.nodes[name].pidns) for name in ("head", "w1", "w2")}
            for name, pids in started.items():  # each stand-in runs in its own node's PID namespace
                mine = before[name]
                assert {pids["server"], pids["engine"], pids["worker"]} <= set(mine), (name, pids, mine)
                assert f"laminar-standin-{name}" in mine[pids["engine"]]["cmd"]
            assert len({started[n]["node"] for n in started}) == 3  # Ray placed them on three nodes

            driver.stdin.write("kill\n")
            driver.stdin.flush()
            result = _read_json(driver, 180)
            after = {name: _processes(c.nodes[name].pidns) for name in ("head", "w1", "w2")}
        finally:
            if driver.poll() is None:
                driver.stdin.write("done\n")
                driver.stdin.flush()
            driver.wait(60)

        # what the product reported: w1's three processes, on w1's node, gone
        w1 = started["w1"]
        assert {(p["node"], p["pid"], p["state"]) for p in result["report"]} == {
            (w1["node"], w1[k], "gone") for k in ("server", "engine", "worker")}
        # what the host sees: those processes are gone; the decoys' are the same processes as before; raylets run
        for k in ("server", "engine", "worker"):
            gone = before["w1"][w1[k]]["host_pid"]
            assert all(p["host_pid"] != gone for p in after["w1"].values()), (k, gone)
        for name in ("head", "w2"):
            for k in ("server", "engine", "worker"):
                pid = started[name][k]
                assert after[name].get(pid) == before[name][pid], (name, k)
        for name in ("head", "w1", "w2"):
            assert any("raylet" in p["cmd"] for p in after[name].values()), f"the raylet of {name} is gone"
        # and what Ray sees: the w1 server is dead, the decoys answer and their engines run, every node is alive
        assert result["after"] == {"w1": {"server_answers": False},
                                   "w2": {"server_answers": True, "engine_running": True},
                                   "head": {"server_answers": True, "engine_running": True}}
        assert sorted(result["alive_nodes"]) == sorted(c.nodes[n].ip for n in ("head", "w1", "w2"))
    assert time.monotonic() - t0 < 300  # a bound, not the target
