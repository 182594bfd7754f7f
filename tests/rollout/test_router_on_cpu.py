"""LaminarRouter with fake replicas: a fake server labels outputs with the version it serves, a fake refresher
changes that version. Checks whole-group placement, per-replica refresh only at batch end, version pinning."""

from __future__ import annotations

import asyncio

import pytest

from verl_laminar.policy.dispatch import RoutingError
from verl_laminar.rollout.router import LaminarRouter, ReplicaHandles


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
        assert (0, 1) in [(r, v) for r, v, _ in ev["versions"]]
        assert len(ev["started"]) == 10  # 5 groups x n=2

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
        finished = router.drain_events()["finished"]
        assert len(finished) == 24 and all(e["n"] >= e["version"] for e in finished)
        assert router.get_total_inflight() == 0

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
        async def broken(replica, version):
            if version > 0:
                raise OSError("relay gone")
            replica.server.version = version

        reps = [ReplicaHandles(0, "a0", FakeServer())]
        router = LaminarRouter(reps, groups_per_batch=1, refresher=broken)
        await router.start(0)
        await router.assign_group("g1", 1)
        waiting = asyncio.ensure_future(router.assign_group("g2", 1))
        await router.on_publish(1)
        await router.finish_group("g1")
        with pytest.raises(RuntimeError, match="refresh of replica 0 failed"):
            await waiting
        with pytest.raises(RuntimeError, match="failed refresh"):
            await router.assign_group("g3", 1)

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


def test_a_refresh_waits_until_the_relay_has_committed_the_version():
    class Relay:
        def __init__(self):
            self.calls = 0

        async def _newest(self):
            self.calls += 1
            return 0 if self.calls < 3 else 1

        @property
        def newest(self):
            outer = self

            class M:
                def remote(self):
                    return outer._newest()
            return M()

    async def main():
        tries = []

        async def loader(replica, version):
            tries.append(version)
            replica.server.version = version

        relay = Relay()
        router = LaminarRouter([ReplicaHandles(0, "a0", FakeServer())], groups_per_batch=1, refresher=loader,
                               relays={0: relay})
        await router.start(0)
        await router.on_publish(1)
        for _ in range(100):
            if router.versions() == {0: 1}:
                break
            await asyncio.sleep(0.05)
        assert router.versions() == {0: 1} and tries == [0, 1] and relay.calls >= 3

    asyncio.run(main())
