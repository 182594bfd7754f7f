"""laminar.buffer.max_staleness on the router (policy.bound): a run whose long groups reach a staleness above k
without the bound stays within k with it, every group still finishes (nothing dropped), and the trainer publishes
every version. Fake replicas: each request sleeps its group's length; a fake trainer publishes every 20 ms, waiting
on hold_publish as LaminarTrainer does (trainer.bound)."""

from __future__ import annotations

import asyncio
from typing import Optional

import pytest

from verl_laminar.rollout.router import LaminarRouter, ReplicaHandles
from verl_laminar.trainer import bound

LONG, SHORT = 0.25, 0.005  # every 4th group is a long tail
VERSIONS = 8


class _Ready:
    def remote(self):
        return asyncio.sleep(0, result=True)


class Server:
    __ray_ready__ = _Ready()


async def _run(k: Optional[int], groups: int = 16) -> dict:
    reps = [ReplicaHandles(i, f"addr{i}", Server()) for i in range(2)]

    async def refresher(replica, version):
        await asyncio.sleep(0.001)

    router = LaminarRouter(reps, groups_per_batch=2, refresher=refresher, max_staleness=k)
    await router.start(0)
    staleness: list[int] = []

    async def group(i: int) -> None:
        gid = f"g{i}"
        a = await router.assign_group(gid, 1)
        addr, _ = await router.acquire_pinned(f"{gid}-0", gid, a.version)
        await asyncio.sleep(LONG if i % 4 == 0 else SHORT)
        await router.release_server(addr, f"{gid}-0")
        n = await router.trajectory_finished(f"{gid}_0", gid, 3, 5)
        staleness.append(n - a.version)
        await router.finish_group(gid)

    held: list[int] = []  # polls that found groups blocking, per publication

    async def trainer() -> None:
        for v in range(1, VERSIONS + 1):
            await asyncio.sleep(0.02)  # a training step
            held.append(0)
            while router.hold_publish(v):
                held[-1] += 1
                await asyncio.sleep(0.002)
            await router.on_publish(v)

    await asyncio.wait_for(asyncio.gather(trainer(), *[group(i) for i in range(groups)]), 30)
    finished = router.drain_events().finished
    return {"staleness": staleness, "finished": len(finished), "published": router.published(), "held": held}


def test_without_the_bound_long_groups_exceed_k():
    out = asyncio.run(_run(None))
    assert max(out["staleness"]) > 1, out  # what the bound has to prevent
    assert sum(out["held"]) == 0  # unbounded: hold_publish never holds


@pytest.mark.parametrize("k", [0, 1, 2])
def test_with_the_bound_every_trajectory_is_within_k_and_none_is_dropped(k):
    out = asyncio.run(_run(k))
    assert out["finished"] == 16 and len(out["staleness"]) == 16  # every group generated and finished
    assert max(out["staleness"]) <= k, out
    assert out["published"] == VERSIONS  # the trainer's waits all ended
    assert sum(out["held"]) > 0  # the long groups did hold publications back


def test_adoption_beyond_the_bound_is_refused_so_the_group_is_generated_again():
    async def main():
        router = LaminarRouter([ReplicaHandles(0, "a0", Server())], groups_per_batch=1,
                               refresher=lambda r, v: asyncio.sleep(0), max_staleness=1)
        await router.start(3)
        assert await router.adopt_group("old", 2, 1) is None  # 3 - 1 > 1
        a = await router.adopt_group("recent", 2, 2)
        assert a is not None and a.version == 2

    asyncio.run(main())


class _Remote:
    def __init__(self, fn):
        self.remote = fn


class FakeRouterHandle:
    def __init__(self, answers):
        self._answers = list(answers)
        self.hold_publish = _Remote(lambda v: self._answers.pop(0) if self._answers else [])


def test_the_trainer_waits_until_nothing_blocks_and_logs_what_it_waits_for(caplog):
    now = [0.0]
    router = FakeRouterHandle([[("g1", 0, 1)]] * 3)

    def sleep(s):
        now[0] += 20.0  # each poll "takes" 20 s: the wait is logged at 30 s

    with caplog.at_level("WARNING"):
        waited = bound.wait_to_publish(router, 3, 1, health=lambda: None, get=lambda x: x, clock=lambda: now[0],
                                       sleep=sleep)
    assert waited == 60.0
    assert "waits 40 s for 1 open groups older than 2" in caplog.text and "('g1', 0, 1)" in caplog.text


def test_the_trainer_wait_ends_with_the_routers_failure():
    class Stopped(RuntimeError):
        pass

    def health():
        raise Stopped("the router stopped")

    with pytest.raises(Stopped):
        bound.wait_to_publish(FakeRouterHandle([[("g1", 0, 1)]] * 99), 3, 1, health=health, get=lambda x: x,
                              sleep=lambda s: None)


def test_unbounded_the_trainer_never_asks():
    assert bound.wait_to_publish(object(), 3, None, health=lambda: None) == 0.0
