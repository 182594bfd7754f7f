"""Where relays run and what a start sweeps: relays only on rollout nodes and the master's node; stale relay
actors are those whose group is gone; a store is removed only when no live relay holds its lock."""

import fcntl
import os
import subprocess
import sys
import threading
import time

import pytest

from verl_laminar.platform.shm_cleanup import (
    LOCK_FILE,
    StoreInUseError,
    acquire_store,
    remove_unused_store,
    sweep_relay_stores,
)
from verl_laminar.relay.group import stale_relay_actors
from verl_laminar.relay.store import RelayStore
from verl_laminar.trainer.relays import relay_nodes

pytestmark = pytest.mark.ray_driver  # starts a Ray driver: runs in a child interpreter


def _node(nid, alive=True):
    return {"NodeID": nid, "NodeManagerAddress": f"10.0.0.{ord(nid[-1])}", "Alive": alive}


NODES = [_node("n-a"), _node("n-b"), _node("n-c"), _node("n-d"), _node("n-e", alive=False)]


@pytest.mark.parametrize("rollout, master, want", [
    ({"n-b", "n-c"}, "n-a", ["n-a", "n-b", "n-c"]),  # n-d: a trainer-only node gets no relay
    ({"n-a", "n-b"}, "n-a", ["n-a", "n-b"]),  # rollouts beside the trainer share the master
    ({"n-b", "n-e"}, "n-a", ["n-a", "n-b"]),  # a dead node gets none
    (None, "n-b", ["n-a", "n-b", "n-c", "n-d"]),  # no replicas given: every alive node, as before
])
def test_relay_nodes(rollout, master, want):
    got = relay_nodes(NODES, rollout, master)
    assert [nid for nid, _ in got] == want
    assert dict(got)["n-a"] == "10.0.0.97"


def test_relay_nodes_needs_the_master_alive():
    with pytest.raises(ValueError, match="trainer rank 0's node n-e"):
        relay_nodes(NODES, {"n-b"}, "n-e")


def test_stale_relay_actors_are_those_whose_group_is_gone():
    named = [
        {"namespace": "crashed", "name": "g:relay0-aaa"},  # its group died with its driver
        {"namespace": "crashed", "name": "g:relay1-aaa"},
        {"namespace": "live", "name": "g"},  # a concurrent job with the same group name
        {"namespace": "live", "name": "g:relay0-bbb"},
        {"namespace": "crashed", "name": "other:relay0-aaa"},  # another group
        {"namespace": "crashed", "name": "g_pool"},
    ]
    assert stale_relay_actors(named, "g") == [("crashed", "g:relay0-aaa"), ("crashed", "g:relay1-aaa")]


def test_a_live_store_refuses_a_second_owner(tmp_path):
    root = str(tmp_path / "s")
    store = RelayStore(root)
    with pytest.raises(StoreInUseError, match=f"pid {os.getpid()}"):
        RelayStore(root, lock_timeout_s=0.2)
    store.close()
    RelayStore(root).close()


def _holder(root):
    """A separate process holding a store, as a live relay does."""
    code = "import sys, time\nfrom verl_laminar.relay.store import RelayStore\nRelayStore(sys.argv[1])\n" \
           "print('ready', flush=True)\ntime.sleep(120)\n"
    p = subprocess.Popen([sys.executable, "-c", code, root], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def test_sweep_removes_only_stores_of_relays_that_are_gone(tmp_path):
    base = tmp_path / "laminar-relay"
    live, dead, closed, old = (str(base / n) for n in ("live", "dead", "closed", "old"))
    holder, victim = _holder(live), _holder(dead)
    try:
        victim.kill()  # SIGKILL: nothing cleans up, the kernel drops its lock
        victim.wait()
        RelayStore(closed).close()
        os.makedirs(old)  # a store of a relay from before stores were locked
        open(os.path.join(old, "v000000000001.data"), "wb").close()
        os.makedirs(base / ".swept-x-1234")  # a sweep that was interrupted
        (base / "stray").write_text("not a store")
        removed = sweep_relay_stores(str(base))
        assert sorted(removed) == sorted([dead, closed, old])
        assert sorted(os.listdir(base)) == ["live", "stray"]
        assert os.path.exists(os.path.join(live, LOCK_FILE))
    finally:
        holder.kill()
        holder.wait()
    assert sweep_relay_stores(str(base)) == [live]


def test_relay_waiting_for_a_swept_lock_starts_a_fresh_store(tmp_path):
    root = str(tmp_path / "s")
    os.makedirs(root)
    sweeper = os.open(os.path.join(root, LOCK_FILE), os.O_RDWR | os.O_CREAT)
    fcntl.flock(sweeper, fcntl.LOCK_EX)  # a sweep holds the lock of a store it is removing
    got = {}
    t = threading.Thread(target=lambda: got.update(fd=acquire_store(root, timeout_s=10)))
    t.start()
    time.sleep(0.2)
    os.rename(root, str(tmp_path / "tomb"))  # what the sweep does before unlocking
    os.close(sweeper)
    t.join(10)
    fd = got["fd"]
    try:
        here = os.stat(os.path.join(root, LOCK_FILE))
        assert (os.fstat(fd).st_dev, os.fstat(fd).st_ino) == (here.st_dev, here.st_ino)
        assert not remove_unused_store(root)  # held by its new owner
    finally:
        os.close(fd)


def test_destroy_leaves_nothing(tmp_path):
    base = tmp_path / "laminar-relay"
    store = RelayStore(str(base / "r0"))
    store.preallocate(4096)
    store.destroy()
    assert not base.exists()


# ---- under Ray: stale relays killed, live ones of another job untouched ----
@pytest.mark.e2e  # a local Ray cluster starts in ~20-40 s on 2 cores
def test_sweep_stale_relays_under_ray(tmp_path):
    import uuid

    import ray

    from verl_laminar.relay.group import RelayGroup, relay_actor_name, sweep_stale_relays
    from verl_laminar.relay.relay import Relay

    group = f"sweeptest_{uuid.uuid4().hex[:6]}"
    old_ns, live_ns = f"old-{uuid.uuid4().hex[:6]}", f"live-{uuid.uuid4().hex[:6]}"
    base = tmp_path / "laminar-relay"
    ray.init(num_cpus=4, include_dashboard=False, namespace=f"sweeptest-{uuid.uuid4().hex[:6]}")
    live = []
    try:
        node = ray.get_runtime_context().get_node_id()
        # what an earlier version left after a crash: a detached relay without its group
        stale = ray.remote(Relay).options(name=relay_actor_name(group, "relay0-old"), namespace=old_ns,
                                          lifetime="detached", num_cpus=0).remote("relay0-old",
                                                                                  root=str(base / "relay0-old"))
        # a concurrent job with the same group name: alive, must be left alone
        live.append(ray.remote(RelayGroup).options(name=group, namespace=live_ns, lifetime="detached",
                                                   num_cpus=0).remote(group))
        live.append(ray.remote(Relay).options(name=relay_actor_name(group, "relay0-live"), namespace=live_ns,
                                              lifetime="detached", num_cpus=0).remote("relay0-live",
                                                                                      root=str(base / "relay0-live")))
        ray.get([stale.ping.remote(), live[1].ping.remote()])
        out = sweep_stale_relays(group, [node], base=str(base))
        assert out["actors"] == [(old_ns, relay_actor_name(group, "relay0-old"))]
        assert out["stores"][node] == [str(base / "relay0-old")]
        assert ray.get(live[1].ping.remote()) == "relay0-live" and os.path.isdir(base / "relay0-live")
        with pytest.raises(ValueError):
            ray.get_actor(relay_actor_name(group, "relay0-old"), namespace=old_ns)

        # keep_versions and chunk_mb reach every relay of a spawned group
        g = ray.remote(RelayGroup).options(num_cpus=0).remote(f"{group}_spawned")
        ip = ray.util.get_node_ip_address()
        ray.get(g.spawn.remote({f"s{i}-{group}": (node, ip) for i in range(2)}, keep_versions=3, chunk_mb=2.0))
        info = ray.get(ray.get_actor(ray.get(g.actor_name.remote(f"s1-{group}"))).info.remote())
        assert info["keep_versions"] == 3
        ray.get(g.shutdown.remote())
        assert not os.path.exists(info["root"])
    finally:
        for h in live:
            ray.kill(h)
        ray.shutdown()
