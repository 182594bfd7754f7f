"""Relay join (``RelayGroup.ensure_relay``, ``trainer.relays``) with fakes for Ray: a replica on a node without a live
relay (a node that joined after the spawn, or whose relay died) gets one spawned there before it joins, once per
node even when two replicas of that node join at once; the trainer's relay setup starts the group's monitor, timed
by ``laminar.heartbeat``."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
import ray

from verl_laminar.config.schema import HeartbeatConfig
from verl_laminar.policy.chain import ChainPlan, add_relay, rebuild_chain
from verl_laminar.relay import group as group_mod
from verl_laminar.relay.group import RelayGroup
from verl_laminar.trainer import relays


class _Handle:
    """``handle.method.remote(*a)`` returns ``obj.method(*a)``; ``ray.get`` is the identity in these tests."""

    def __init__(self, obj) -> None:
        self._obj = obj

    def __getattr__(self, name):
        return SimpleNamespace(remote=getattr(self._obj, name))


def _group(spawn_s: float = 0.0) -> RelayGroup:
    """A group of relays r0 (node nA, the master) and r1 (nB); its spawn records instead of starting an actor."""
    g = RelayGroup("g")
    g._plan = ChainPlan(relays=("r0", "r1"))
    g._nodes = {"r0": "nA", "r1": "nB"}
    g.spawned = []

    def spawn_replacement(relay_id, node_id, node_ip, master=False):
        time.sleep(spawn_s)  # a real spawn waits for the actor: long enough for a second join to race it
        g.spawned.append((relay_id, node_id, node_ip, master))
        with g._lock:
            g._nodes[relay_id] = node_id
            g._plan = add_relay(g._plan, relay_id, master)

    g.spawn_replacement = spawn_replacement
    return g


def test_a_node_with_a_live_relay_keeps_it_and_a_node_without_one_gets_one_at_the_tail():
    g = _group()
    assert g.ensure_relay("nA", "10.0.0.1") == "r0" and g.spawned == []
    new = g.ensure_relay("nC", "10.0.0.3")  # a node that joined after the spawn
    assert g.spawned == [(new, "nC", "10.0.0.3", False)] and g._plan.relays == ("r0", "r1", new)
    assert g.ensure_relay("nC", "10.0.0.3") == new and len(g.spawned) == 1  # then it is found, not spawned again


def test_a_node_whose_relay_died_gets_a_new_one():
    g = _group()
    g._plan = rebuild_chain(g._plan, ["r1"])  # the monitor dropped r1; its node id stays recorded
    assert g.relay_on_node("nB") is None
    new = g.ensure_relay("nB", "10.0.0.2")
    assert new != "r1" and g.spawned == [(new, "nB", "10.0.0.2", False)] and g.relay_on_node("nB") == new


def test_two_replicas_of_one_new_node_joining_at_once_get_one_relay():
    g = _group(spawn_s=0.2)
    got = []
    threads = [threading.Thread(target=lambda: got.append(g.ensure_relay("nC", "10.0.0.3"))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(g.spawned) == 1 and got == [g.spawned[0][0]] * 2


@pytest.fixture
def fake_ray(monkeypatch):
    monkeypatch.setattr(ray, "get", lambda x, timeout=None: x)
    monkeypatch.setattr(ray, "get_actor", lambda name, namespace=None: f"actor {name}")
    nodes = [{"NodeID": n, "NodeManagerAddress": ip, "Alive": True}
             for n, ip in (("nA", "10.0.0.1"), ("nB", "10.0.0.2"), ("nC", "10.0.0.3"))]
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    monkeypatch.setattr(relays, "node_of", lambda actor: actor)  # a worker stands for its node id
    return nodes


def test_replica_relays_spawns_a_relay_on_a_new_node_before_the_replica_joins(fake_ray):
    g = _group()
    replicas = [SimpleNamespace(replica_id=i, workers=(node,)) for i, node in enumerate(("nA", "nC", "nC"))]
    out = relays.replica_relays(_Handle(g), replicas)
    new = g.spawned[0][0]
    assert g.spawned == [(new, "nC", "10.0.0.3", False)]
    assert out == {0: "actor g:r0", 1: f"actor g:{new}", 2: f"actor g:{new}"}
    fake_ray[2]["Alive"] = False  # a replica on a node Ray declared dead: no relay can start there
    with pytest.raises(RuntimeError, match="not an alive Ray node"):
        relays.replica_relays(_Handle(_group()), [SimpleNamespace(replica_id=5, workers=("nC",))])


def test_the_relay_setup_starts_the_monitor_timed_by_the_heartbeat(fake_ray, monkeypatch):
    made = []

    class FakeGroup:
        def __init__(self, name, **monitor) -> None:
            self.name, self.monitor, self.monitoring = name, monitor, False
            made.append(self)

        def spawn(self, nodes, **kw):
            self.nodes = nodes
            return "plan"

        def start_monitor(self):
            self.monitoring = True

    from verl_laminar.fleet import helpers

    options = {}
    monkeypatch.setattr(helpers, "here", lambda soft=True: ("the TaskRunner's node", soft))
    monkeypatch.setattr(ray, "remote", lambda cls: SimpleNamespace(options=lambda **kw: options.update(kw) or
                                                                   SimpleNamespace(remote=lambda *a, **k: _Handle(FakeGroup(*a, **k)))))
    monkeypatch.setattr(group_mod, "sweep_stale_relays", lambda name, nodes: {})
    admitted = []  # the start-up check runs on real relays in tests/relay/test_relay_group_ray_on_cpu.py
    monkeypatch.setattr(relays, "admit_relays", lambda group, name, nodes, master, size, keep:
                        admitted.append((sorted(nodes) == sorted(made[0].nodes), nodes[master][0], size, keep)))
    relays.spawn_relays("nA", heartbeat=HeartbeatConfig(interval_s=2.0, dead_after_s=12.0), version_bytes=123)
    # every spawned relay is checked, the master being the one on trainer rank 0's node (nA)
    assert admitted == [(True, "nA", 123, 2)]
    assert made[0].monitoring and made[0].monitor == {"ping_timeout_s": 12.0, "monitor_interval_s": 2.0}
    assert sorted(nid for nid, _ in made[0].nodes.values()) == ["nA", "nB", "nC"]
    # the group itself beside the trainer's loop, whatever node Ray would pick for a 0-CPU actor
    assert options["scheduling_strategy"] == ("the TaskRunner's node", False)
    assert relays.monitor_settings(None) == {"ping_timeout_s": relays.DEFAULT_PING_TIMEOUT_S,
                                             "monitor_interval_s": relays.DEFAULT_MONITOR_INTERVAL_S}
    assert relays.monitor_settings(HeartbeatConfig(interval_s=1.0))["ping_timeout_s"] == relays.DEFAULT_PING_TIMEOUT_S
