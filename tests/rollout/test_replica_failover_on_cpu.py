"""A replica dies under the router (verl's path): the pinned client reports the actor error, the router
probes and fails the replica over; a group moves to a live replica of its version and its requests run again
there, or, with no such replica, its requests raise ReplicaLost. Fake servers fail like dead Ray actors."""

from __future__ import annotations

import asyncio

import pytest
from ray.exceptions import RayActorError

from laminar_testing import ActorShell, MortalServer, client_config, router_over
from verl_laminar.policy.replica_loss import ReplicaLost
from verl_laminar.rollout.client import GROUP_PIN, LaminarLLMServerClient
from verl_laminar.rollout.router import ReplicaHandles


def _config():
    return client_config()


async def _setup(n: int, gpb: int = 2):
    servers = {i: MortalServer(i) for i in range(n)}
    router, loads = router_over(servers, gpb)
    router._failover.probe_timeout_s = 1.0
    await router.start(0)
    client = LaminarLLMServerClient(_config(), load_balancer_handle=ActorShell(router))
    return router, servers, client, loads


async def _group(router, client, gid: str, n: int = 2):
    pin = await router.assign_group(gid, n)
    GROUP_PIN.set(pin)
    try:
        outs = await asyncio.gather(*[asyncio.create_task(
            client.generate(f"{gid}-{s}", prompt_ids=[gid, s], sampling_params={})) for s in range(n)])
    finally:
        await router.finish_group(gid)
    return pin, outs


def test_a_dead_replicas_group_moves_to_a_live_replica_of_its_version_and_reruns_there():
    async def main():
        router, servers, client, loads = await _setup(3, gpb=1)
        work = asyncio.gather(*[asyncio.create_task(_group(router, client, g)) for g in ("ga", "gb", "gc")])
        await asyncio.sleep(0.02)
        victim = router._state.pins["ga"].replica_id
        servers[victim].die()
        results = await work
        for pin, outs in results:
            assert {o.extra_fields["global_steps"] for o in outs} == {0}  # every response on the group's version
        assert all(s.served == [] for s in [servers[victim]])
        ga_prompts = {("ga", 0), ("ga", 1)}
        assert ga_prompts <= {p for r, s in servers.items() if r != victim for p in s.served}
        ev = router.drain_events().failures
        assert [(e.replica_id, e.lost) for e in ev] == [(victim, ())]
        assert [g for g, _ in ev[0].moved] == ["ga"]
        # the dead replica loads nothing more, takes nothing more; the others go on
        await router.on_publish(1)
        await asyncio.sleep(0.05)
        assert victim not in {r for r, v in loads if v == 1}
        pin, outs = await _group(router, client, "gd")
        assert pin.replica_id != victim and pin.version == 1
        assert router.snapshot()["dead"] == [victim]

    asyncio.run(main())


def test_with_no_live_replica_on_its_version_the_group_is_lost_loudly():
    async def main():
        router, servers, client, loads = await _setup(2, gpb=1)
        pin = await router.assign_group("ga", 2)
        await router.on_publish(1)  # replica 1 (idle) moves on to version 1; ga keeps replica 0 on version 0
        while router.versions()[1 - pin.replica_id] != 1:
            await asyncio.sleep(0.01)
        GROUP_PIN.set(pin)
        req = asyncio.create_task(client.generate("ga-0", prompt_ids=["ga", 0], sampling_params={}))
        await servers[pin.replica_id].started.wait()
        servers[pin.replica_id].die()
        with pytest.raises(ReplicaLost, match="no live replica serves version 0"):
            await req
        # the group's other requests fail the same way, at once (no retry on another version)
        with pytest.raises(ReplicaLost):
            await client.generate("ga-1", prompt_ids=["ga", 1], sampling_params={})
        await router.finish_group("ga")
        ev = router.drain_events().failures
        assert ev[0].lost == (("ga", 2),) and ev[0].moved == ()
        pin2, outs = await _group(router, client, "gb")
        assert pin2.replica_id == 1 - pin.replica_id and {o.extra_fields["global_steps"] for o in outs} == {1}

    asyncio.run(main())


def test_an_actor_error_from_a_live_replica_is_raised_not_failed_over():
    async def main():
        router, servers, client, _ = await _setup(2, gpb=1)
        pin = await router.assign_group("ga", 1)
        GROUP_PIN.set(pin)
        servers[pin.replica_id].hiccup = True
        with pytest.raises(RayActorError):
            await client.generate("ga-0", prompt_ids=["ga", 0], sampling_params={})
        assert router.snapshot()["dead"] == [] and router.drain_events().failures == ()

    asyncio.run(main())


def test_a_replica_dying_while_it_loads_is_failed_over_and_dispatch_goes_on():
    async def main():
        router, servers, client, loads = await _setup(2, gpb=1)
        servers[0].die()
        await router.on_publish(1)  # replica 0's load fails: it is dead, not a reason to stop
        while router.versions()[1] != 1:
            await asyncio.sleep(0.01)
        assert router.snapshot()["dead"] == [0]
        pin, outs = await _group(router, client, "ga")
        assert pin.replica_id == 1
        servers[1].die()
        await router.on_publish(2)
        with pytest.raises(RuntimeError, match="every rollout replica is dead"):
            await asyncio.wait_for(router.assign_group("gb", 1), 5)

    asyncio.run(main())


def test_a_failure_on_a_replica_the_group_already_left_is_judged_by_that_replica():
    """Repack moved the group to replica 1 while its request on replica 0 was failing: replica 0 is the one
    probed and failed over, and the request runs again where the group is now."""
    from verl_laminar.policy.dispatch import move_group

    async def main():
        router, servers, client, _ = await _setup(2, gpb=1)
        pin = await router.assign_group("ga", 1)
        other = 1 - pin.replica_id
        await _group(router, client, "gb", n=1)  # nothing open on `other` now; it stays on version 0
        router._state = move_group(router._state, "ga", other)
        servers[pin.replica_id].die()
        assert await router.replica_failed("ga", 0, "ActorDiedError()", f"a{pin.replica_id}") == "moved"
        assert router.snapshot()["dead"] == [pin.replica_id]
        # the live replica answers: an actor error from it is not a death
        assert await router.replica_failed("ga", 0, "RayActorError()", f"a{other}") == "alive"

    asyncio.run(main())


def test_movable_groups_are_the_open_ones_another_live_replica_serves_at_their_version():
    """What fault injection waits for before it kills a replica to test the continuation: a group there that a
    death would move (same version elsewhere), not lose."""
    async def main():
        router, servers, client, _ = await _setup(2, gpb=1)
        pin = await router.assign_group("ga", 1)
        assert router.open_groups_on(pin.replica_id) == 1
        assert router.movable_groups_on(pin.replica_id) == [pin.group_id]  # the other replica serves version 0 too
        await router.on_publish(1)  # the idle replica moves on to version 1; ga keeps its replica on 0
        while router.versions()[1 - pin.replica_id] != 1:
            await asyncio.sleep(0.01)
        assert router.open_groups_on(pin.replica_id) == 1 and router.movable_groups_on(pin.replica_id) == []

    asyncio.run(main())


class HoldingRelay:
    """A relay committed through version 1 (what a refresh reads) with the calls parking makes: ``hold`` (True
    while ``readable`` holds the version) and ``release``."""

    def __init__(self, readable=(0, 1)) -> None:
        self.readable, self.held, self.released = set(readable), [], []

    def newest(self):
        return 1

    def versions(self):
        return sorted(self.readable)

    def describe(self, version=None):
        return {}

    def progress(self):
        return {}

    def hold(self, version):
        self.held.append(version)
        return version in self.readable

    def release(self, version):
        self.released.append(version)


async def _setup_parking(relay: HoldingRelay):
    """Two replicas, one replacement allowed; replica 1 moves on to version 1 while group ``ga`` keeps replica 0 on
    version 0, and ``ga``'s request is in flight there."""
    router, servers, client, loads = await _setup(2, gpb=1)
    router._failover.replacements_left = 1
    pin = await router.assign_group("ga", 2)
    await router.on_publish(1)
    other = 1 - pin.replica_id
    while router.versions()[other] != 1:
        await asyncio.sleep(0.01)
    shell = ActorShell(relay)  # one machine: both replicas read the same relay
    router._book.relays = {0: shell, 1: shell}
    GROUP_PIN.set(pin)
    req = asyncio.create_task(client.generate("ga-0", prompt_ids=["ga", 0], sampling_params={}))
    await servers[pin.replica_id].started.wait()
    return router, servers, client, loads, pin, req


def _await_until(router, cond):
    async def wait():
        for _ in range(500):
            if cond():
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"condition not met; versions {router.versions()}")
    return wait()


def test_a_group_no_live_replica_serves_is_parked_for_the_replacement_which_loads_its_version_first():
    async def main():
        relay = HoldingRelay()
        router, servers, client, loads, pin, req = await _setup_parking(relay)
        servers[pin.replica_id].die()
        await _await_until(router, lambda: router.dead_replicas() == [pin.replica_id])
        await asyncio.sleep(0.05)
        assert not req.done()  # parked: the request waits for the replacement instead of raising ReplicaLost
        assert relay.held == [0]  # every relay keeps version 0 readable meanwhile
        ev = router.drain_events().failures
        assert ev[0].parked == ("ga",) and ev[0].lost == () and ev[0].moved == ()
        # a second request of the group (the other response) waits too
        req2 = asyncio.create_task(client.generate("ga-1", prompt_ids=["ga", 1], sampling_params={}))
        await asyncio.sleep(0.05)
        assert not req2.done()
        servers[2] = MortalServer(2)
        router.add_replica(ReplicaHandles(2, "a2", ActorShell(servers[2])), replaces=pin.replica_id)
        outs = await asyncio.wait_for(asyncio.gather(req, req2), 5.0)
        assert {o.extra_fields["global_steps"] for o in outs} == {0}  # one version for the whole group
        assert loads[-1] == (2, 0)  # the replacement's first load was the group's version, not the newest (1)
        assert set(servers[2].served) == {("ga", 0), ("ga", 1)}
        adopted = router.drain_events().adopted
        assert [(a.replica_id, a.version, a.groups) for a in adopted] == [(2, 0, ("ga",))]
        # it takes no new group on the old version; once ga finishes it refreshes to the newest
        gb = asyncio.create_task(router.assign_group("gb", 1))
        await asyncio.sleep(0.05)
        assert router._state.replica(2).open_groups == frozenset({"ga"})
        await router.finish_group("ga")
        await _await_until(router, lambda: router.versions()[2] == 1)
        assert (await asyncio.wait_for(gb, 5.0)).version == 1
        await _await_until(router, lambda: relay.released == [0])  # the hold ends with the parked groups
        await router.close()

    asyncio.run(main())


def test_parked_groups_are_lost_when_the_replacement_fails_or_the_relays_no_longer_hold_their_version():
    async def main(readable, fail_replacement):
        relay = HoldingRelay(readable)
        router, servers, client, loads, pin, req = await _setup_parking(relay)
        servers[pin.replica_id].die()
        if fail_replacement:
            await _await_until(router, lambda: router.dead_replicas() == [pin.replica_id])
            await asyncio.sleep(0.05)
            assert not req.done()
            router.replacement_failed(pin.replica_id, "RuntimeError('no devices')")
        with pytest.raises(ReplicaLost, match="no live replica serves version 0"):
            await asyncio.wait_for(req, 5.0)
        await router.finish_group("ga")
        fails = router.drain_events().failures
        assert fails[0].parked == ("ga",)
        assert fails[-1].followup and fails[-1].lost == (("ga", 2),)
        await _await_until(router, lambda: relay.released == [0])
        await router.close()

    asyncio.run(main(readable=(1,), fail_replacement=False))  # version 0 evicted before the death was seen
    asyncio.run(main(readable=(0, 1), fail_replacement=True))


def test_without_a_replacement_coming_a_group_is_lost_not_parked():
    async def main():
        relay = HoldingRelay()
        router, servers, client, loads, pin, req = await _setup_parking(relay)
        router._failover.replacements_left = 0
        servers[pin.replica_id].die()
        with pytest.raises(ReplicaLost):
            await asyncio.wait_for(req, 5.0)
        assert relay.held == [] and router.drain_events().failures[0].parked == ()

    asyncio.run(main())


def test_relays_hold_a_lagging_replicas_version_while_it_has_open_groups_and_release_it_after():
    """The hang a chaos run found: a replica stopped mid-batch is found dead 30 s later, when newer publications
    have evicted its version. Its version is held from the first newer publication on, so its groups can park."""
    async def main():
        relay = HoldingRelay(readable=(0, 1))
        router, servers, client, loads = await _setup(2, gpb=1)
        shell = ActorShell(relay)
        router._book.relays = {0: shell, 1: shell}
        await router.assign_group("ga", 1)
        await asyncio.sleep(0.05)
        assert relay.held == []  # v0 is the newest: nothing to hold
        await router.on_publish(1)
        await _await_until(router, lambda: relay.held == [0])  # ga's replica lags: its version is held
        assert router._failover.holds.held == {0}
        await router.finish_group("ga")  # its batch ends: it refreshes, v0 is needed no more
        await _await_until(router, lambda: relay.released == [0])
        assert router._failover.holds.held == set()
        await router.close()

    asyncio.run(main())


def test_a_refused_hold_is_not_asked_again_and_the_groups_of_a_death_are_then_lost():
    async def main():
        relay = HoldingRelay(readable=(1,))  # no room (or gone): every hold of version 0 is refused
        router, servers, client, loads = await _setup(2, gpb=1)
        router._failover.replacements_left = 1
        shell = ActorShell(relay)
        router._book.relays = {0: shell, 1: shell}
        pin = await router.assign_group("ga", 1)
        await router.on_publish(1)
        await _await_until(router, lambda: relay.held == [0])
        for _ in range(5):
            router._pump()
        await asyncio.sleep(0.05)
        assert relay.held == [0]  # refused once, not asked again while it stays wanted
        GROUP_PIN.set(pin)
        req = asyncio.create_task(client.generate("ga-0", prompt_ids=["ga", 0], sampling_params={}))
        await servers[pin.replica_id].started.wait()
        servers[pin.replica_id].die()
        with pytest.raises(ReplicaLost):  # parked, asked once more, refused: lost
            await asyncio.wait_for(req, 5.0)
        assert relay.held == [0, 0]
        await router.close()

    asyncio.run(main())


def test_a_parked_group_whose_requests_all_gave_up_leaves_nothing_for_the_replacement_to_load():
    async def main():
        relay = HoldingRelay()
        router, servers, client, loads, pin, req = await _setup_parking(relay)
        servers[pin.replica_id].die()
        await _await_until(router, lambda: router._failover.parked == {0: {"ga"}})
        req.cancel()
        await router.finish_group("ga")  # verl ended the group (its requests gave up)
        assert router._failover.parked == {} and router._failover.park_futs == {}
        servers[2] = MortalServer(2)
        router.add_replica(ReplicaHandles(2, "a2", ActorShell(servers[2])), replaces=pin.replica_id)
        await _await_until(router, lambda: router.versions()[2] == 1)  # the newest, not the abandoned version 0
        assert (2, 0) not in loads
        await router.close()

    asyncio.run(main())


class GoneRelay(HoldingRelay):
    """The relay of a machine that was lost: every call fails as Ray's would."""

    def hold(self, version):
        raise RuntimeError("ActorDiedError: the relay's machine is gone")


def test_holds_ask_only_the_relays_of_live_replicas_after_a_machine_loss():
    """chaos --nodes found it: after a machine kill every hold failed on the lost machine's relay, so no lagging
    version was held for the survivors ("relays do not hold version N ... ActorDiedError")."""
    async def main():
        live, gone = HoldingRelay(readable=(0, 1)), GoneRelay()
        router, servers, client, loads = await _setup(3, gpb=1)
        router._book.relays = {0: ActorShell(live), 1: ActorShell(live), 2: ActorShell(gone)}
        router._failover.fail(2, "its machine was lost")
        pin = await router.assign_group("ga", 1)
        assert pin.replica_id != 2
        await router.on_publish(1)
        await _await_until(router, lambda: 0 in router._failover.holds.held, )  # held on the live relay, not refused
        assert set(live.held) == {0}, live.held
        assert router._failover.holds.held == {0} and router._failover.holds.refused == set()
        await router.close()

    asyncio.run(main())


def test_holds_go_to_the_chains_master_relay_too():
    """chaos --nodes found it: a partitioned replica's version was held only on its own relay (the master has no
    replica on it), so once that machine was cut no relay could give the version to the new machine's relay, and
    the replacement loading the parked groups' version found it gone and stopped the run."""
    from verl_laminar.rollout.books import CHAIN_MASTER

    async def main():
        live, master = HoldingRelay(readable=(0, 1)), HoldingRelay(readable=(0, 1))
        router, servers, client, loads = await _setup(2, gpb=1)
        router._book.relays = {0: ActorShell(live), 1: ActorShell(live), CHAIN_MASTER: ActorShell(master)}
        await router.assign_group("ga", 1)
        await router.on_publish(1)
        await _await_until(router, lambda: 0 in router._failover.holds.held)
        assert master.held == [0] and set(live.held) == {0}  # the master holds what the replicas' relays hold
        await router.close()

    asyncio.run(main())


def test_a_relay_gone_with_its_machine_is_skipped_by_a_hold_and_a_failing_one_is_not():
    """A partition took a relay's machine while a dead replica's groups were parked: the hold failed on that
    relay alone (ActorDiedError) and the groups were lost, though every relay left held their version."""
    from ray.exceptions import ActorDiedError

    from verl_laminar.rollout.holds import RelayHolds

    class GoneRelay:
        def hold(self, version):
            raise ActorDiedError()

    class BrokenRelay:
        def hold(self, version):
            raise RuntimeError("store unreadable")

    async def main():
        live, gone = HoldingRelay(readable=(0, 1)), ActorShell(GoneRelay())
        ok, _ = await RelayHolds(lambda: [ActorShell(live), gone])._hold(0)
        assert ok and live.held == [0]
        ok, why = await RelayHolds(lambda: [gone])._hold(0)
        assert not ok and "no relay is left" in why
        ok, why = await RelayHolds(lambda: [ActorShell(live), ActorShell(BrokenRelay())])._hold(0)
        assert not ok and "store unreadable" in why
        ok, _ = await RelayHolds(lambda: [ActorShell(live), gone])._hold(7)  # not readable on the live one
        assert not ok

    asyncio.run(main())
