"""laminar.buffer.max_staleness on the router (rollout.router_bound, policy.bound): a run whose long groups are
trained far behind without the bound has verl's lag at training, (s - 1) - j, within k with it; every group still
finishes and is trained (nothing dropped), and the trainer trains every step. Fake replicas: each request sleeps its
group's length; a fake trainer takes each step's batch through plan_batch, as LaminarReplayBuffer does
(trainer.bound), trains 20 ms and publishes."""

from __future__ import annotations

import asyncio
from typing import Optional

import pytest

from verl_laminar.rollout.router import LaminarRouter, ReplicaHandles
from verl_laminar.trainer import bound

LONG, SHORT = 0.25, 0.005  # every 4th group is a long tail
STEPS, PER_STEP = 8, 2


class _Ready:
    def remote(self):
        return asyncio.sleep(0, result=True)


class Server:
    __ray_ready__ = _Ready()


async def _run(k: Optional[int], ready_first: bool = False) -> dict:
    """``ready_first``: the trainer may see a group before its ``finish_group`` reaches the router, as in production
    (verl writes the group's finished status to its TransferQueue inside the agent loop, and the loop calls
    ``finish_group`` after that)."""
    reps = [ReplicaHandles(i, f"addr{i}", Server()) for i in range(2)]

    async def refresher(replica, version):
        await asyncio.sleep(0.001)

    router = LaminarRouter(reps, groups_per_batch=2, refresher=refresher, max_staleness=k, batch_groups=PER_STEP)
    await router.start(0)
    ready: list[tuple[str, int]] = []  # complete groups the trainer has not taken (its ExperienceBuffer)
    made = [0]

    async def group(i: int) -> None:
        gid = f"g{i}"
        a = await router.assign_group(gid, 1)
        addr, _ = await router.acquire_pinned(f"{gid}-0", gid, a.version)
        await asyncio.sleep(LONG if i % 4 == 0 else SHORT)
        await router.release_server(addr, f"{gid}-0")
        await router.trajectory_finished(f"{gid}_0", gid, 3, 5)
        if ready_first:
            ready.append((gid, a.version))
            await asyncio.sleep(0.03)  # the trainer takes a step meanwhile
            await router.finish_group(gid)
        else:
            await router.finish_group(gid)
            ready.append((gid, a.version))

    async def prompts() -> None:  # verl keeps prompts queued ahead of the trainer
        tasks = []
        while True:
            while made[0] - (len(lags) + len(ready)) < 6:
                tasks.append(asyncio.ensure_future(group(made[0])))
                made[0] += 1
            await asyncio.sleep(0.002)

    lags: list[int] = []
    waits = [0]

    async def trainer() -> None:
        for step in range(1, STEPS + 1):
            while True:
                chosen = None if len(ready) < PER_STEP else (
                    router.plan_batch(step, list(ready)) if k is not None else [g for g, _ in ready[:PER_STEP]])
                if chosen is not None:
                    break
                waits[0] += len(ready) >= PER_STEP
                await asyncio.sleep(0.002)
            versions = dict(ready)
            lags.extend(step - 1 - versions[g] for g in chosen)
            ready[:] = [gv for gv in ready if gv[0] not in chosen]
            await asyncio.sleep(0.02)  # a training step
            await router.on_publish(step)

    feeder = asyncio.ensure_future(prompts())
    await asyncio.wait_for(trainer(), 30)
    feeder.cancel()
    return {"lags": lags, "published": router.published(), "waits": waits[0],
            "untrained": dict(router._bounds.untrained)}


def test_without_the_bound_long_groups_are_trained_far_behind():
    out = asyncio.run(_run(None))
    assert max(out["lags"]) > 2, out  # what the bound has to prevent


@pytest.mark.parametrize("k", [0, 1, 2])
def test_with_the_bound_every_trained_group_is_within_k_and_every_step_trains(k):
    out = asyncio.run(_run(k))
    assert len(out["lags"]) == STEPS * PER_STEP  # every step took a whole batch
    assert max(out["lags"]) <= k, out
    assert out["published"] == STEPS
    # what the router still counts as untrained is exactly what the trainer has not taken
    assert all(g.startswith("g") for g in out["untrained"])


@pytest.mark.parametrize("k", [1, 2])
def test_groups_the_trainer_takes_before_their_finish_group_do_not_hang_the_bound(k):
    """Production's order: verl's status write makes a group ready before the agent loop's finish_group reaches the
    router. A group taken in between once stayed 'untrained' forever: pending for every later batch and holding
    an admission slot, so the trainer waited for it and no replica took new work (a hang)."""
    out = asyncio.run(_run(k, ready_first=True))
    assert len(out["lags"]) == STEPS * PER_STEP and out["published"] == STEPS
    assert max(out["lags"]) <= k, out


def test_a_group_taken_before_its_finish_group_is_never_untrained_again():
    """The bound's books directly (rollout.router_bound): the race above, step by step."""
    from verl_laminar.policy.dispatch import Assignment
    from verl_laminar.rollout.books import GroupBook
    from verl_laminar.rollout.router_bound import BoundBook

    book, groups = BoundBook(2, 8), GroupBook()

    def done(g, v):
        groups.n[g] = groups.finished[g] = 4
        book.finished(g, Assignment(g, 0, v), groups)

    ready13 = [(f"g{i}", 10) for i in range(4)] + [(f"g{i}", 11) for i in range(4, 8)]
    for g, v in ready13[:7]:
        done(g, v)
    pins = {"g7": Assignment("g7", 1, 11)}  # complete in verl's buffer, its finish_group not yet in
    groups.n["g7"] = groups.finished["g7"] = 4
    assert sorted(book.plan(13, ready13, pins, set())) == sorted(g for g, _ in ready13)
    book.finished("g7", pins.pop("g7"), groups)  # the agent loop's finish_group arrives late
    assert book.untrained == {} and book.taken == set()
    ready14 = [(f"a{i}", 11) for i in range(4)] + [(f"b{i}", 12) for i in range(10)] + [(f"c{i}", 13) for i in range(9)]
    for g, v in ready14:
        done(g, v)
    assert book.admission({}, set(), 13) == (11, 1)  # with the stale entry: (14, 0), nothing admitted
    assert book.plan(14, ready14, {}, set()) is not None  # with it: None on every call, the hang


def test_a_dropped_group_stops_counting_against_admission():
    async def main():
        router = LaminarRouter([ReplicaHandles(0, "a0", Server())], groups_per_batch=4,
                               refresher=lambda r, v: asyncio.sleep(0), max_staleness=0, batch_groups=1)
        await router.start(0)
        a = await router.assign_group("g0", 1)
        await router.trajectory_finished("g0_0", "g0", 1, 1)
        await router.finish_group("g0")
        assert router._bounds.untrained == {"g0": a.version}
        waiter = asyncio.ensure_future(router.assign_group("g1", 1))
        await asyncio.sleep(0.01)
        assert not waiter.done()  # k = 0, one group a step: g0 fills step 1
        assert router.plan_batch(1, [], dropped=["g0"]) is None  # its prompt failed: the trainer will not take it
        await asyncio.sleep(0.01)
        assert waiter.done() and router._bounds.untrained == {}

    asyncio.run(main())


def test_adoption_beyond_the_bound_is_refused_so_the_group_is_generated_again():
    async def main():
        router = LaminarRouter([ReplicaHandles(0, "a0", Server())], groups_per_batch=1,
                               refresher=lambda r, v: asyncio.sleep(0), max_staleness=1, batch_groups=1)
        await router.start(3)
        assert await router.adopt_group("old", 2, 1) is None  # trained at step 4 at the earliest: lag 2 > 1
        a = await router.adopt_group("recent", 2, 2)
        assert a is not None and a.version == 2

    asyncio.run(main())


def test_the_bound_needs_the_groups_a_step_trains():
    with pytest.raises(ValueError, match="data.train_batch_size"):
        LaminarRouter([ReplicaHandles(0, "a0", Server())], groups_per_batch=1, max_staleness=1)


class _Remote:
    def __init__(self, fn):
        self.remote = fn


class FakeRouterHandle:
    def __init__(self, answers):
        self._answers = list(answers)
        self.calls: list = []
        self.plan_batch = _Remote(self._plan)

    def _plan(self, step, ready, dropped, size):
        self.calls.append((step, ready, dropped, size))
        return self._answers.pop(0)


def test_the_trainer_logs_a_long_wait_and_counts_it(caplog):
    now = [0.0]
    router = FakeRouterHandle([None, None, None, ["g2"]])
    planner = bound.BatchPlanner(lambda: router, 1, get=lambda x: x, clock=lambda: now[0])
    with caplog.at_level("INFO"):
        for _ in range(3):
            assert planner(3, [("g2", 2)], []) is None
            now[0] += 20.0  # each poll "takes" 20 s: the wait is logged at 30 s
        assert planner(3, [("g2", 2)], ["gone"], 1) == ["g2"]
    assert planner.wait_s == 60.0
    assert "step 3 waits 40 s for groups still generating" in caplog.text
    assert "step 3 took its batch after 60.0 s" in caplog.text
    assert router.calls[-1] == (3, [("g2", 2)], ["gone"], 1)
