"""Replacement replicas (``fleet.replacement``): the loop replaces each dead replica once, with a new rank, within
the run's limit, and a failed start leaves the fleet smaller without stopping the loop. The router side
(``add_replica``): a replacement joins unloaded, loads the newest version, then takes groups."""

from __future__ import annotations

import asyncio

import pytest

from laminar_testing import ActorShell, MortalServer, router_over
from verl_laminar.fleet.replacement import ReplacementLoop, next_replica_id, plan_replacements
from verl_laminar.policy.dispatch import RoutingError
from verl_laminar.rollout.router import ReplicaHandles


def test_plan_replaces_each_dead_replica_once_within_the_limit():
    assert plan_replacements([3, 1], handled=[], started=0, limit=8) == ([1, 3], [])
    assert plan_replacements([3, 1], handled=[1], started=1, limit=8) == ([3], [])
    # two deaths, one replacement left: the lower rank is replaced, the other refused
    assert plan_replacements([2, 5], handled=[], started=7, limit=8) == ([2], [5])
    assert plan_replacements([2], handled=[], started=0, limit=0) == ([], [2])
    with pytest.raises(ValueError, match="limit=-1"):
        plan_replacements([], [], 0, -1)


def test_a_new_replica_gets_a_rank_no_replica_of_the_run_had():
    assert next_replica_id([0, 1]) == 2
    assert next_replica_id([0, 3, 1]) == 4
    assert next_replica_id([]) == 0


class _Fleet:
    """The loop's narrow handles over a dict of replicas: id -> alive."""

    def __init__(self, n: int, fail_launch: tuple = ()) -> None:
        self.alive = {i: True for i in range(n)}
        self.released, self.launched, self.joined, self.failed = [], [], [], []
        self.fail_launch = set(fail_launch)

    def dead(self):
        return [i for i, a in self.alive.items() if not a]

    def known(self):
        return list(self.alive)

    def release(self, rid):
        self.released.append(rid)

    def launch(self, rid):
        self.launched.append(rid)
        if rid in self.fail_launch:
            raise RuntimeError(f"replica {rid} did not start")
        return f"handles-{rid}"

    def join(self, handles, dead):
        rid = int(handles.split("-")[1])
        self.alive[rid] = True
        self.joined.append((handles, dead))

    def fail(self, dead, error):
        self.failed.append((dead, error))

    def loop(self, limit: int = 8) -> ReplacementLoop:
        t = iter(range(1000))
        return ReplacementLoop(self.dead, self.known, self.release, self.launch, self.join, self.fail, limit=limit,
                               clock=lambda: float(next(t)))


def test_each_dead_replica_is_released_then_replaced_by_a_new_rank_that_joins():
    fleet = _Fleet(2)
    loop = fleet.loop()
    assert loop.check() == []  # nobody dead: nothing happens
    fleet.alive[1] = False
    (rec,) = loop.check()
    assert (rec.dead, rec.new, rec.error) == (1, 2, None)
    assert rec.launch_s == 1.0  # the fake clock ticks once between seeing the death and the join
    assert fleet.released == [1] and fleet.launched == [2] and fleet.joined == [("handles-2", 1)]
    assert fleet.failed == []
    assert loop.check() == []  # replica 1 is handled: never replaced twice
    fleet.alive[2] = False  # the replacement dies too: it is replaced in turn, by a rank never used
    (rec,) = loop.check()
    assert (rec.dead, rec.new) == (2, 3)
    assert [r.dead for r in loop.snapshot()] == [1, 2]


def test_a_failed_start_is_recorded_and_its_rank_never_reused_and_the_limit_holds():
    fleet = _Fleet(3, fail_launch=(3,))
    loop = fleet.loop(limit=2)
    fleet.alive[0] = False
    (rec,) = loop.check()
    assert rec.new == 3 and "did not start" in rec.error and rec.joined_s is None
    assert fleet.joined == [] and fleet.failed == [(0, rec.error)]  # the router hears of it
    fleet.alive[1] = False
    (rec,) = loop.check()
    assert rec.new == 4 and rec.error is None  # 3 was given out once: the next replica is 4
    fleet.alive[2] = False  # a third death: two replacements were started, the limit
    assert loop.check() == []
    assert fleet.launched == [3, 4]
    assert fleet.failed[-1] == (2, "laminar.replace.max_replacements=2 reached")
    assert loop.check() == []  # refused once, and not tried again
    assert len(fleet.failed) == 2


def test_a_dead_replica_is_released_at_once_while_another_replacement_is_still_starting():
    """A replica lost while a replacement starts (minutes on a real model) is released by the release thread at
    once, not after that launch: Ray's GCS retries a placement group whose bundle was on a lost machine in a busy
    loop until it is removed. Each release happens once, whichever thread gets there first."""
    import threading

    fleet = _Fleet(3)
    launching, finish = threading.Event(), threading.Event()
    plain_launch = fleet.launch

    def slow_launch(rid):
        launching.set()
        assert finish.wait(10.0), "the test never let the launch finish"
        return plain_launch(rid)

    fleet.launch = slow_launch
    loop = ReplacementLoop(fleet.dead, fleet.known, fleet.release, fleet.launch, fleet.join, fleet.fail, limit=8,
                           interval_s=0.01).start()
    try:
        fleet.alive[0] = False
        assert launching.wait(10.0), "replica 0's replacement never started"
        fleet.alive[1] = False  # lost while replica 0's replacement is still starting
        for _ in range(1000):
            if 1 in fleet.released:
                break
            threading.Event().wait(0.01)
        assert fleet.released == [0, 1] and fleet.launched == []  # 1 released while 3 is still starting
        finish.set()
        for _ in range(1000):
            if len(fleet.joined) == 2:
                break
            threading.Event().wait(0.01)
        assert fleet.joined == [("handles-3", 0), ("handles-4", 1)]
        assert sorted(fleet.released) == [0, 1]  # the replacement thread did not release 1 a second time
    finally:
        finish.set()
        loop.stop()


def test_a_release_past_the_limit_still_happens_and_a_failed_one_is_logged_not_retried():
    fleet = _Fleet(2)
    calls = []

    def release(rid):
        calls.append(rid)
        if rid == 1:
            raise RuntimeError("the placement group is gone already")

    loop = ReplacementLoop(fleet.dead, fleet.known, release, fleet.launch, fleet.join, fleet.fail, limit=0)
    fleet.alive[0] = fleet.alive[1] = False
    assert loop.release_dead() == [0]  # 1 failed: logged, not counted as released
    assert loop.release_dead() == [] and calls == [0, 1]  # neither is released twice
    assert loop.check() == [] and fleet.launched == []  # past the limit (0): refused, but released


def test_a_replacement_joins_the_router_unloaded_loads_the_newest_version_and_takes_groups():
    async def main():
        router, loads = router_over([MortalServer(0)], 1, replacements=1)
        await router.start(0)
        await router.on_publish(1)  # replica 0 holds no group: it refreshes to 1
        for _ in range(100):
            if router.versions()[0] == 1:
                break
            await asyncio.sleep(0.01)
        router._failover.fail(0, "killed")
        assert router.dead_replicas() == [0]
        router._raise_if_failed()  # no replica alive, but one is coming: the router waits
        with pytest.raises(RoutingError, match="already in the fleet"):
            router.add_replica(ReplicaHandles(0, "a9", ActorShell(MortalServer(0))))
        router.add_replica(ReplicaHandles(1, "a1", ActorShell(MortalServer(1))), replaces=0)
        for _ in range(100):
            if router.versions().get(1) == 1:
                break
            await asyncio.sleep(0.01)
        assert router.versions() == {0: 1, 1: 1}
        assert (1, 1) in loads  # its first load is the newest version, not v0
        pin = await asyncio.wait_for(router.assign_group("g", 2), 5.0)
        assert (pin.replica_id, pin.version) == (1, 1)
        await router.close()

    asyncio.run(main())


def test_with_every_replica_dead_the_router_waits_for_a_replacement_and_stops_when_none_comes():
    async def main(replacements: int):
        router, _ = router_over([MortalServer(0)], 1, replacements=replacements)
        await router.start(0)
        await router.assign_group("g0", 2)  # replica 0's batch is full (one group per batch)
        waiting = asyncio.ensure_future(router.assign_group("g", 2))
        await asyncio.sleep(0.01)
        router._failover.fail(0, "killed")
        await asyncio.sleep(0.01)
        if replacements:
            assert not waiting.done()  # the group waits for the replacement
            router.replacement_failed(0, "RuntimeError('no devices')")
        with pytest.raises(RuntimeError, match="every rollout replica is dead and none is being replaced"):
            await asyncio.wait_for(waiting, 5.0)
        with pytest.raises(RuntimeError, match="every rollout replica is dead"):
            router._raise_if_failed()

    asyncio.run(main(0))
    asyncio.run(main(1))
