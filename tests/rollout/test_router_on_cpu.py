"""LaminarRouter with fake replicas: a fake server labels outputs with the version it serves, a fake refresher
changes that version, a fake relay commits versions (slowly, or never). Checks whole-group placement,
per-replica refresh only at batch end, version pinning, refresh deadlines, retries and evicted versions."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import pytest

from laminar_testing import ActorShell
from verl_laminar.policy.dispatch import RoutingError
from verl_laminar.policy.timeouts import RefreshSettings
from verl_laminar.rollout.router import LaminarRouter, ReplicaHandles

FAST = RefreshSettings(min_wait_s=0.3, retry_backoff_s=0.0)  # test-sized floor, immediate retries


class _Ready:
    """``server.__ray_ready__.remote()``: the router's liveness probe; these servers never die."""

    def remote(self):
        return asyncio.sleep(0, result=True)


class FakeServer:
    __ray_ready__ = _Ready()

    def __init__(self) -> None:
        self.version = -1
        self.inflight = 0

    async def generate(self) -> int:
        self.inflight += 1
        await asyncio.sleep(0.001)
        self.inflight -= 1
        return self.version


def make_router(n_replicas: int = 2, gpb: int = 2):
    servers = {i: FakeServer() for i in range(n_replicas)}
    loads: list[tuple[int, int]] = []

    async def refresher(replica: ReplicaHandles, version: int) -> None:
        assert servers[replica.replica_id].inflight == 0, "refresh under a running request"
        await asyncio.sleep(0.001)
        servers[replica.replica_id].version = version
        loads.append((replica.replica_id, version))

    reps = [ReplicaHandles(i, f"addr{i}", servers[i]) for i in range(n_replicas)]
    return LaminarRouter(reps, groups_per_batch=gpb, refresher=refresher), servers, loads


async def run_group(router: LaminarRouter, gid: str, n: int = 2) -> set[int]:
    a = await router.assign_group(gid, n)
    labels = set()
    for i in range(n):
        addr, server = await router.acquire_pinned(f"{gid}-{i}", gid, a.version)
        labels.add(await server.generate())
        await router.release_server(addr, f"{gid}-{i}")
        await router.trajectory_finished(f"{gid}_{i}", gid, 3, 5)
    await router.finish_group(gid)
    assert labels == {a.version}
    return labels


def test_start_loads_v0_on_every_replica_before_any_group():
    async def main():
        router, servers, loads = make_router()
        waiting = asyncio.ensure_future(router.assign_group("g0", 2))
        await asyncio.sleep(0.01)
        assert not waiting.done()  # nothing published: no replica holds weights
        assert await router.start(0) == {0: 0, 1: 0}
        a = await waiting
        assert a.version == 0 and sorted(loads) == [(0, 0), (1, 0)]

    asyncio.run(main())


def test_replica_refreshes_only_when_its_own_batch_ends():
    async def main():
        router, servers, loads = make_router(gpb=2)
        await router.start(0)
        a = [await router.assign_group(f"g{i}", 2) for i in range(4)]
        assert [x.replica_id for x in a] == [0, 1, 0, 1]  # spread: fewest groups taken first
        await router.on_publish(1)
        await asyncio.sleep(0.01)
        assert router.versions() == {0: 0, 1: 0}  # both batches still open: no refresh, no abort
        r0 = [x for x in a if x.replica_id == 0]
        for x in r0:
            await router.finish_group(x.group_id)
        await asyncio.sleep(0.02)
        assert router.versions() == {0: 1, 1: 0}  # replica 0 alone pulled the new version
        nxt = await router.assign_group("g9", 2)
        assert (nxt.replica_id, nxt.version) == (0, 1)
        ev = router.drain_events()
        assert (0, 1) in [(e.replica_id, e.version) for e in ev.loaded]
        assert len(ev.started) == 10  # 5 groups x n=2

    asyncio.run(main())


def test_groups_wait_when_every_batch_is_full_and_run_all_requests_on_one_version():
    async def main():
        router, servers, loads = make_router(n_replicas=2, gpb=1)
        await router.start(0)

        async def publisher():
            for v in range(1, 4):
                await asyncio.sleep(0.003)
                await router.on_publish(v)

        results = await asyncio.gather(publisher(), *[run_group(router, f"g{i}") for i in range(12)])
        assert all(len(r) == 1 for r in results[1:])
        finished = router.drain_events().finished
        assert len(finished) == 24 and all(e.n >= e.version for e in finished)
        assert router.get_total_inflight() == 0

    asyncio.run(main())


def test_events_carry_load_intervals_and_a_clock_pair_that_converts_another_nodes_clock():
    """The router's clock here starts 10^6 s away from this process's monotonic clock (another node): its own
    (clock, Unix time) pair turns its event times into Unix times all the same."""
    from verl_laminar import timeline as tl

    async def slow_load(replica, version):
        await asyncio.sleep(0.05)
        replica.server.version = version

    async def main():
        router = LaminarRouter([ReplicaHandles(0, "a0", FakeServer())], groups_per_batch=1, refresher=slow_load,
                               clock=lambda: time.monotonic() + 1e6)
        t_before = time.time()
        await router.start(0)
        await run_group(router, "g1", n=2)
        await router.on_publish(1)
        await asyncio.wait_for(router.assign_group("g2", 1), 5)  # after the refresh to version 1
        events = router.drain_events()
        t_after = time.time()
        (load0, load1) = events.loaded
        assert (load0.replica_id, load0.version, load0.from_version) == (0, 0, -1)
        assert (load1.version, load1.from_version) == (1, 0)
        assert all(v.start_s + 0.04 <= v.finish_s for v in events.loaded)  # t0 .. t1 spans the 0.05 s load
        assert abs(events.clock[0] - (time.monotonic() + 1e6)) < 1.0
        assert all(e.assigned_s is not None and e.assigned_s <= e.finish_s for e in events.finished)
        records = tl.records_from_events(events)
        assert [type(r).__name__ for r in records] == ["TrajectorySpan", "TrajectorySpan", "Load", "Load"]
        for r in records:
            assert t_before - 0.01 <= r.start <= r.end <= t_after + 0.01, r
        assert records[2].end <= records[0].start and records[1].end <= records[3].start
        from verl_laminar.rollout.events import RouterEvents

        drained = router.drain_events()
        assert type(drained) is RouterEvents and not (drained.started or drained.finished or drained.loaded)

    asyncio.run(main())


def test_unpinned_or_wrong_version_requests_raise():
    async def main():
        router, servers, loads = make_router()
        await router.start(0)
        with pytest.raises(RoutingError):
            await router.acquire_server("r1")
        a = await router.assign_group("g", 2)
        with pytest.raises(RoutingError):
            await router.acquire_pinned("r2", "g", a.version + 1)
        with pytest.raises(RoutingError):
            await router.acquire_pinned("r3", "other", 0)

    asyncio.run(main())


def test_failed_refresh_fails_waiting_groups_loudly():
    async def main():
        tries = []

        async def broken(replica, version):
            tries.append(version)
            if version > 0:
                raise OSError("relay gone")
            replica.server.version = version

        reps = [ReplicaHandles(0, "a0", FakeServer())]
        router = LaminarRouter(reps, groups_per_batch=1, refresher=broken, refresh=FAST)
        await router.start(0)
        await router.assign_group("g1", 1)
        waiting = asyncio.ensure_future(router.assign_group("g2", 1))
        await router.on_publish(1)
        await router.finish_group("g1")
        with pytest.raises(RuntimeError, match="refresh of replica 0 failed"):
            await waiting
        with pytest.raises(RuntimeError, match="router stopped"):
            await router.assign_group("g3", 1)
        assert tries == [0, 1]  # a failed load stops the run at once: no second transfer into that engine
        assert "relay gone" in router.failure() and router._queue == []
        # a stopped router plans nothing: a later publication starts no refresh and resolves no waiter
        await router.on_publish(2)
        await asyncio.sleep(0.05)
        assert tries == [0, 1] and router._waiters == {}

    asyncio.run(main())


def test_a_running_router_reports_no_failure():
    async def main():
        async def load(replica, version):
            replica.server.version = version

        router = LaminarRouter([ReplicaHandles(0, "a0", FakeServer())], groups_per_batch=1, refresher=load,
                               refresh=FAST)
        await router.start(0)
        assert router.failure() is None

    asyncio.run(main())


def test_close_stops_refreshes_and_dispatch():
    async def main():
        router, servers, loads = make_router(n_replicas=1, gpb=1)
        await router.start(0)
        await router.assign_group("g1", 1)
        waiting = asyncio.ensure_future(router.assign_group("g2", 1))
        await router.close()
        await router.on_publish(1)
        await router.finish_group("g1")
        await asyncio.sleep(0.01)
        assert router.versions() == {0: 0} and not waiting.done()
        waiting.cancel()

    asyncio.run(main())


class FakeRelay:
    """A machine-local relay: ``versions`` committed, plus at most one version ``arriving`` whose chunks come in
    one every ``chunk_s`` (``progress``) until all ``chunks`` are there and it commits; ``chunk_s=None``: its
    chunks never come (a dead chain)."""

    def __init__(self, versions=(), total_bytes: int = 1 << 20, chunk_size: int = 1 << 16) -> None:
        self.committed = list(versions)
        self.total_bytes, self.chunk_size = total_bytes, chunk_size
        self.arriving = None  # (version, started, chunk_s, chunks)
        self.calls = 0

    def send(self, version: int, chunk_s, chunks: int) -> None:
        self.arriving = (version, time.monotonic(), chunk_s, chunks)

    def _tick(self) -> None:
        if self.arriving is None:
            return
        v, t0, chunk_s, chunks = self.arriving
        if chunk_s is not None and time.monotonic() - t0 >= chunk_s * chunks:
            self.committed.append(v)
            self.arriving = None

    def newest(self):
        self.calls += 1
        self._tick()
        return max(self.committed) if self.committed else None

    def versions(self):
        self._tick()
        return sorted(self.committed)

    def progress(self):
        self._tick()
        if self.arriving is None:
            return {}
        v, t0, chunk_s, chunks = self.arriving
        return {v: 0 if chunk_s is None else int((time.monotonic() - t0) / chunk_s)}

    def describe(self, version=None):
        m = {"version": version, "total_bytes": self.total_bytes, "chunk_size": self.chunk_size, "tensors": []}
        return {"version": version, "path": f"/relay/v{version}", "manifest": json.dumps(m)}


def one_replica(refresher=None, relay=None, refresh=FAST):
    server = FakeServer()

    async def load(replica, version):
        server.version = version

    router = LaminarRouter([ReplicaHandles(0, "a0", server)], groups_per_batch=1, refresher=refresher or load,
                           relays={0: ActorShell(relay)} if relay is not None else None, refresh=refresh)
    return router, server


def attempts(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "attempt" in r.getMessage()]


def test_a_slow_relay_that_keeps_delivering_chunks_is_waited_for_past_the_floor(caplog):
    async def main():
        relay = FakeRelay()
        relay.send(0, chunk_s=0.05, chunks=20)  # commits after ~1 s, more than three floors of 0.3 s
        router, server = one_replica(relay=relay, refresh=RefreshSettings(min_wait_s=0.3, retries=0))
        t0 = time.monotonic()
        assert await router.start(0) == {0: 0}
        assert time.monotonic() - t0 > 0.9 and server.version == 0
        assert router._loader.version_bytes == relay.total_bytes and router._loader.version_chunks == 16  # learnt for deadlines

    caplog.set_level(logging.WARNING)
    asyncio.run(main())
    assert attempts(caplog) == []


class EvictingRelay(FakeRelay):
    """A relay keeping its ``keep`` newest versions, plus those pinned by a load (counted, as the store's holds)."""

    def __init__(self, versions=(), keep: int = 2) -> None:
        super().__init__(versions)
        self.keep, self.pins, self.pinned_ever = keep, {}, []

    def commit(self, version: int) -> None:
        self.committed.append(version)
        old = sorted(v for v in self.committed if v not in self.pins)
        for v in old[: max(0, len(old) - self.keep)]:
            self.committed.remove(v)

    def pin(self, version):
        if version not in self.committed:
            return False
        self.pins[version] = self.pins.get(version, 0) + 1
        self.pinned_ever.append(version)
        return True

    def unpin(self, version):
        self.pins[version] -= 1
        if not self.pins[version]:
            del self.pins[version]
        self.commit_none()

    def commit_none(self) -> None:  # evict what the unpin left beyond keep
        old = sorted(v for v in self.committed if v not in self.pins)
        for v in old[: max(0, len(old) - self.keep)]:
            self.committed.remove(v)


def test_a_load_slower_than_two_publishes_keeps_its_version_pinned_on_the_relay():
    """A replacement starting beside another on a busy machine took 29 s to load; two publishes meanwhile evicted
    its version (keep_versions=2) and the run stopped. The loader pins the version on the replica's relay for the
    length of the load, and unpins it after."""
    async def main():
        relay = EvictingRelay(versions=(0,), keep=2)
        server = FakeServer()

        async def slow_load(replica, version):
            relay.commit(1)
            relay.commit(2)  # two publishes during the load: unpinned, version 0 would be gone now
            if version not in relay.committed:
                raise LookupError(f"version {version} is not readable; readable: {relay.committed}")
            server.version = version

        router = LaminarRouter([ReplicaHandles(0, "a0", server)], groups_per_batch=1, refresher=slow_load,
                               relays={0: ActorShell(relay)}, refresh=FAST)
        assert await router.start(0) == {0: 0}
        assert server.version == 0 and relay.pinned_ever == [0]
        assert relay.pins == {} and relay.committed == [1, 2]  # unpinned after the load, then evicted
        await router.close()

    asyncio.run(main())


def test_a_relay_that_never_progresses_times_out_after_the_retries(caplog):
    async def main():
        relay = FakeRelay()
        relay.send(0, chunk_s=None, chunks=20)
        router, server = one_replica(relay=relay, refresh=RefreshSettings(min_wait_s=0.2, retries=2,
                                                                          retry_backoff_s=0.0))
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match="router stopped") as err:
            await router.start(0)
        assert isinstance(err.value.__cause__, TimeoutError)
        cause = str(err.value.__cause__)
        assert "no chunk arrived" in cause and "laminar.refresh.min_wait_s" in cause
        assert time.monotonic() - t0 > 3 * 0.2 and server.version == -1

    caplog.set_level(logging.WARNING)
    asyncio.run(main())
    logged = attempts(caplog)
    assert len(logged) == 2
    assert all("waiting for version 0 failed" in m and "ReadableTimeout" in m for m in logged)
    assert "attempt 1 of 3" in logged[0] and "attempt 2 of 3" in logged[1]


def test_a_failed_load_is_not_retried_into_the_same_engine(caplog):
    """A load that raised may have left part of the version in the vLLM engine (or its receiver waiting for the
    rest): a second transfer would interleave with it, so the run stops at once, naming the cause."""
    async def main():
        tries = []

        async def broken(replica, version):
            tries.append(version)
            if version == 1:
                raise OSError("weight transfer failed in bucket 3")
            replica.server.version = version

        router, server = one_replica(refresher=broken)
        await router.start(0)
        await router.assign_group("g1", 1)
        await router.on_publish(1)
        await router.finish_group("g1")
        with pytest.raises(RuntimeError, match="failed"):
            await asyncio.wait_for(router.assign_group("g2", 1), 5)
        assert tries == [0, 1] and isinstance(router._error, OSError)

    caplog.set_level(logging.WARNING)
    asyncio.run(main())
    assert attempts(caplog) == []


def test_a_wait_that_fails_once_is_retried_and_the_run_goes_on(caplog):
    class Flaky(FakeRelay):
        def newest(self):
            self.calls += 1
            if self.calls == 1:
                raise ConnectionError("relay restarting")
            return super().newest()

    async def main():
        relay = Flaky(versions=[0])
        router, server = one_replica(relay=relay, refresh=RefreshSettings(retry_backoff_s=0.0))
        assert await router.start(0) == {0: 0} and server.version == 0

    caplog.set_level(logging.WARNING)
    asyncio.run(main())
    logged = attempts(caplog)
    assert len(logged) == 1 and "waiting for version 0 failed, attempt 1 of 3" in logged[0]


def test_a_load_past_its_deadline_stops_the_run_without_a_second_load(caplog):
    async def main():
        tries = []

        async def hung(replica, version):
            tries.append(version)
            await asyncio.sleep(60)

        router, server = one_replica(refresher=hung, refresh=RefreshSettings(min_wait_s=0.2, retry_backoff_s=0.0))
        with pytest.raises(RuntimeError, match="router stopped") as err:
            await router.start(0)
        assert isinstance(err.value.__cause__, TimeoutError) and "did not finish loading" in str(err.value.__cause__)
        assert tries == [0]  # the first load may still run on the workers: no second one interleaves with it

    caplog.set_level(logging.WARNING)
    asyncio.run(main())
    assert attempts(caplog) == []


def test_a_replica_loads_the_newest_version_its_relay_holds_never_an_evicted_one(caplog):
    """The refresh was decided for version 1; by the time the replica's batch drained, the trainer had published
    2 and 3 and the relay (keep_versions=2) had evicted 1. The replica loads 3, the newest, not 1."""
    async def main():
        relay = FakeRelay(versions=[0])
        loads = []

        async def load(replica, version):
            assert version in relay.committed, f"loaded version {version}, not on the relay {relay.committed}"
            loads.append(version)
            replica.server.version = version

        router, server = one_replica(refresher=load, relay=relay)
        await router.start(0)
        await router.assign_group("g1", 1)
        relay.committed = [0, 1]
        await router.on_publish(1)  # decided while g1 runs: the refresh waits for the batch to end
        relay.committed = [2, 3]
        await router.on_publish(2)
        await router.on_publish(3)
        await router.finish_group("g1")
        a = await asyncio.wait_for(router.assign_group("g2", 1), 5)
        assert (a.version, server.version, loads) == (3, 3, [0, 3])
        assert router.versions() == {0: 3} and router._error is None
        assert [(e.replica_id, e.version) for e in router.drain_events().loaded] == [(0, 0), (0, 3)]

    caplog.set_level(logging.INFO)
    asyncio.run(main())
    assert attempts(caplog) == []


def test_a_refresh_waits_until_the_relay_has_committed_the_version():
    class Relay(FakeRelay):
        def newest(self):
            self.calls += 1
            return 0 if self.calls < 3 else 1

    async def main():
        tries = []

        async def loader(replica, version):
            tries.append(version)
            replica.server.version = version

        relay = Relay()
        router = LaminarRouter([ReplicaHandles(0, "a0", FakeServer())], groups_per_batch=1, refresher=loader,
                               relays={0: ActorShell(relay)})
        await router.start(0)
        await router.on_publish(1)
        for _ in range(100):
            if router.versions() == {0: 1}:
                break
            await asyncio.sleep(0.05)
        assert router.versions() == {0: 1} and tries == [0, 1] and relay.calls >= 3

    asyncio.run(main())


def test_open_groups_on_counts_what_a_death_would_move_or_lose():
    """Fault injection kills a replica once this is > 0: open groups with responses still to generate."""
    async def main():
        router, servers, loads = make_router(gpb=2)
        await router.start(0)
        a = await router.assign_group("g0", 2)
        rid = a.replica_id
        assert router.open_groups_on(rid) == 1 and router.open_groups_on(1 - rid) == 0
        for i in range(2):  # every response generated: the group is still open (being stored) but complete
            await router.trajectory_finished(f"g0_{i}", "g0", 3, 5)
        assert router.open_groups_on(rid) == 0
        await router.finish_group("g0")
        assert router.open_groups_on(rid) == 0

    asyncio.run(main())


def test_a_refresh_whose_probe_raises_stops_the_router_instead_of_hanging():
    """A failed load is followed by a probe of the replica; a probe that itself raises must still end the refresh
    (the router stops with the load's error), never leave a group waiting forever."""
    import asyncio

    import pytest

    from verl_laminar.rollout.router import LaminarRouter, ReplicaHandles

    class NoProbe:  # a server without __ray_ready__: the probe raises AttributeError
        pass

    async def failing(replica, version):
        raise RuntimeError("load broke")

    async def main():
        router = LaminarRouter([ReplicaHandles(0, "a0", NoProbe())], 1, refresher=failing)
        with pytest.raises(RuntimeError, match="load broke"):
            await asyncio.wait_for(router.start(0), 10)

    asyncio.run(main())
