"""The trainer's fault injector (``trainer.faults``) with fakes for Ray: a replica fault waits for work on a live
replica and strikes that one; pool and trainer kills signal the right PID; a garbage fault corrupts the server."""

from __future__ import annotations

import signal
import time
from types import SimpleNamespace

import pytest
import ray

from verl_laminar.config.schema import FaultInjectionConfig, LaminarConfig
from verl_laminar.fleet import node_procs
from verl_laminar.pool.shards import PoolShards
from verl_laminar.trainer import faults as tf
from verl_laminar.trainer import procs


class _Handle:
    """``handle.method.remote(*a)`` returns ``obj.method(*a)``; ``ray.get`` is the identity in these tests."""

    def __init__(self, obj) -> None:
        self._obj = obj

    def __getattr__(self, name):
        return SimpleNamespace(remote=getattr(self._obj, name))


class _Router:
    def __init__(self) -> None:
        self.movable, self.dead, self.inflight = {0: 0, 1: 0}, [], 0  # movable groups per replica (a count)

    def total_inflight(self):
        return self.inflight

    def dead_replicas(self):
        return list(self.dead)

    def movable_groups_on(self, rid):
        return [f"g{i}" for i in range(self.movable.get(rid, 0))]

    def open_groups_on(self, rid):
        return self.movable.get(rid, 0)


class _Pool:
    def __init__(self) -> None:
        self.streamed, self.silent, self.adoptable, self.asked_n = {}, {}, [], []

    def streamed_on(self, rid, min_tokens, groups=None):
        assert groups, "the injector asks for the movable groups' requests only"
        return self.streamed.get(rid, 0)

    def adoptable_groups(self, n, running=False):
        self.asked_n.append((n, running))
        return self.adoptable

    def silence(self, rids):
        return {r: self.silent.get(r, 0.1) for r in rids}


class _Server:
    def __init__(self) -> None:
        self.corrupt = False

    def laminar_corrupt(self):
        self.corrupt = True


@pytest.fixture
def fakes(monkeypatch):
    monkeypatch.setattr(ray, "get", lambda x, timeout=None: x)
    killed, signalled = [], []
    monkeypatch.setattr(procs, "replica_roots", lambda r: [100 + r.replica_id])
    monkeypatch.setattr(procs, "kill_replica", lambda r, pids, hang=False: killed.append((r.replica_id, pids, hang)))
    # the pool's process, located and SIGKILLed on its node (``fleet.node_procs``): recorded as a signal to PID 4242
    pool_ref = SimpleNamespace(node="n1", pidns="pid:[1]", pid=4242, started=1.0)
    monkeypatch.setattr(procs, "kill_actor_process", lambda actor: (signalled.append((4242, signal.SIGKILL)),
                                                                    (pool_ref, [{"pid": 4242, "state": "gone"}]))[1])
    monkeypatch.setattr(node_procs, "locate", lambda actor, timeout_s=None: pool_ref)
    monkeypatch.setattr(tf.os, "kill", lambda pid, sig: signalled.append((pid, sig)))
    monkeypatch.setattr(tf.logging, "shutdown", lambda: None)
    router, pool = _Router(), _Pool()
    servers = {i: _Server() for i in range(2)}
    replicas = [SimpleNamespace(replica_id=i, server=_Handle(servers[i]), workers=()) for i in range(2)]
    return SimpleNamespace(router=router, pool=pool, servers=servers, replicas=replicas, killed=killed,
                           signalled=signalled)


def _injector(f, schedule: str, pool=True) -> tf.FaultInjector:
    lam = LaminarConfig(fault_injection=FaultInjectionConfig(schedule=schedule))
    shards = PoolShards([_Handle(f.pool)]) if pool else None  # one shard: its queries are the merged ones
    return tf.FaultInjector(lam, _Handle(f.router), shards, lambda: f.replicas, 4)


def test_a_replica_fault_waits_for_work_and_strikes_the_replica_that_has_it(fakes):
    inj = _injector(fakes, "2:replica_hang")
    inj.strike(1)
    assert fakes.killed == []  # nothing due at step 1
    inj.strike(2)
    time.sleep(0.1)
    assert fakes.killed == []  # armed: no replica holds work yet
    fakes.router.movable[1], fakes.pool.streamed[1] = 1, 2  # replica 1 has a movable group and streamed requests
    deadline = time.monotonic() + 5
    while not fakes.killed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fakes.killed == [(1, [101], True)]  # SIGSTOP (hang) of replica 1's processes, found at arm time
    inj.land_armed()


def test_an_armed_fault_strikes_at_the_next_step_at_the_latest_and_skips_dead_replicas(fakes):
    fakes.router.dead = [0]
    inj = _injector(fakes, "3:replica_kill")
    inj.strike(3)
    inj.land_armed()  # the next step's end: it strikes now, on the only live replica
    assert fakes.killed == [(1, [101], False)]


def test_a_replica_that_stopped_streaming_is_no_target(fakes):
    # replica 0 holds work but has streamed nothing for 40 s (another fault stopped it, not yet failed over): the
    # fault waits for a replica that streams (a chaos run aimed a garbage fault at a SIGSTOPped replica)
    inj = _injector(fakes, "2:replica_garbage")
    fakes.router.movable[0], fakes.pool.streamed[0], fakes.pool.silent[0] = 1, 2, 40.0
    inj.strike(2)
    time.sleep(0.1)
    assert not fakes.servers[0].corrupt
    fakes.router.movable[1], fakes.pool.streamed[1] = 1, 2
    deadline = time.monotonic() + 5
    while not fakes.servers[1].corrupt and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fakes.servers[1].corrupt and not fakes.servers[0].corrupt
    inj.land_armed()


def test_a_garbage_fault_corrupts_the_server_and_needs_the_pool(fakes):
    inj = _injector(fakes, "1:replica_garbage@0")
    fakes.router.movable[0], fakes.pool.streamed[0] = 1, 2
    inj.strike(1)
    inj.land_armed()
    assert fakes.servers[0].corrupt and not fakes.servers[1].corrupt and fakes.killed == []
    with pytest.raises(ValueError, match="laminar.pool.enabled=true"):
        _injector(fakes, "1:replica_garbage", pool=False)


def test_pool_and_trainer_kills_signal_their_processes(fakes):
    inj = _injector(fakes, "2:pool_kill;2:trainer_kill")
    inj.strike(2)
    assert fakes.signalled[0] == (4242, signal.SIGKILL)  # the pool's process
    time.sleep(0.3)
    assert len(fakes.signalled) == 1  # the trainer's kill waits for a replica that generates
    fakes.router.inflight, fakes.pool.streamed[1] = 2, 1  # requests in flight, tokens of one in the pool
    time.sleep(0.3)
    # only the tails of groups whose other responses are gone: a restarted trainer could adopt nothing yet
    assert len(fakes.signalled) == 1
    fakes.pool.adoptable = ["g"]  # one whole group of 4 streams: a response finishing meanwhile would spoil it
    time.sleep(0.3)
    assert len(fakes.signalled) == 1
    fakes.pool.adoptable = [f"g{i}" for i in range(tf.KILL_WHOLE_GROUPS)]
    deadline = time.monotonic() + 5
    while len(fakes.signalled) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert fakes.signalled[1][1] == signal.SIGKILL and fakes.signalled[1][0] == tf.os.getpid()  # then the trainer
    assert set(fakes.pool.asked_n) == {(4, True)}  # whole: the run's group size, every response still running


def test_a_trainer_kill_strikes_before_the_next_publication_even_with_idle_rollouts(fakes):
    inj = _injector(fakes, "2:trainer_kill")
    inj.strike(2)
    time.sleep(0.2)
    assert fakes.signalled == []
    inj.land_armed()  # the next step's end
    assert fakes.signalled == [(tf.os.getpid(), signal.SIGKILL)]


def test_a_replica_that_dies_before_its_pids_are_found_is_no_target_and_the_trainer_goes_on(fakes, monkeypatch):
    def pids(r):
        if r.replica_id == 0:
            raise RuntimeError("ActorDiedError: the replica was ended (release of a dead replica)")
        return [100 + r.replica_id]

    monkeypatch.setattr(procs, "replica_roots", pids)
    inj = _injector(fakes, "4:replica_kill")
    inj.strike(4)  # does not raise
    inj.land_armed()
    assert fakes.killed == [(1, [101], False)]  # the one that could be struck
    monkeypatch.setattr(procs, "replica_roots", lambda r: (_ for _ in ()).throw(RuntimeError("gone")))
    inj = _injector(fakes, "5:replica_kill")
    inj.strike(5)  # every target gone: skipped, logged
    inj.land_armed()
    assert len(fakes.killed) == 1
