"""laminar.buffer.max_staleness as pure policy (policy.bound): admission's floor and limit, the trainer's earliest-
deadline-first batch and when it waits, dispatch under a floor and a limit, and a simulated run with long tails in
which verl's lag at training, (s - 1) - j, never exceeds k, nothing is dropped and nothing deadlocks."""

from __future__ import annotations

import random

import pytest

from verl_laminar.policy.bound import StalenessBound, lag
from verl_laminar.policy.dispatch import DispatchPolicy, DispatchState, ReplicaState, plan_dispatch


def test_unbounded_admits_everything_and_takes_first_completed():
    b = StalenessBound(None)
    assert not b.on and b.admission(5, 4, 2, [0, 0, 0]) == (None, None)
    assert b.choose(5, [("b", 3), ("a", 0)], [0], 1) == ["a"]  # sorted by version, no wait
    assert b.adoptable(0, 99)


def test_deadline_and_lag_use_verls_definition():
    b = StalenessBound(2)
    assert b.deadline(3) == 6  # trained at step 6, the trainer holds version 5: lag (6 - 1) - 3 = 2
    assert lag(6, 3) == 2 and lag(7, 3) == 3


def test_k0_admits_one_batch_of_the_newest_version_then_nothing_until_the_next_publication():
    b = StalenessBound(0)
    assert b.admission(5, 4, 2, []) == (4, 2)  # step 5 samples after version 4: two groups of version 4
    assert b.admission(5, 4, 2, [4]) == (4, 1)
    assert b.admission(5, 4, 2, [4, 4]) == (5, 0)  # full: nothing more
    assert b.admission(6, 4, 2, []) == (5, 0)  # step 5 sampled, version 5 not out yet: synchronous


def test_k2_floor_and_limit_count_the_groups_not_yet_trained():
    b = StalenessBound(2)
    # next step 5, published 4: versions 2..4 may run (deadlines 5..7), 2 a step over steps 5..7
    assert b.admission(5, 4, 2, []) == (2, 2)  # a version-2 group is due at step 5: room for 2 by then
    assert b.admission(5, 4, 2, [2, 2]) == (3, 2)  # step 5 is full: version 3 (due by 6) is the floor
    assert b.admission(5, 4, 2, [2, 2, 3, 3, 4]) == (4, 1)
    assert b.admission(5, 4, 2, [2, 2, 3, 3, 4, 4]) == (5, 0)
    # a group of version 4 fills a slot of step 7 and after: the older versions keep their own room
    assert b.admission(5, 4, 2, [4, 4, 4, 4]) == (2, 2)


def test_choose_is_earliest_deadline_first_and_waits_only_for_a_group_due_sooner():
    b = StalenessBound(1)
    ready = [("new1", 4), ("new2", 4), ("old", 3)]
    assert b.choose(5, ready, [], 2) == ["old", "new1"]
    # a version-3 group still generating is due at step 5: it must be in this batch, so the step waits for it
    assert b.choose(5, [("n1", 4), ("n2", 4)], [3], 2) is None
    # ... but not for a group due no sooner than every group in the batch
    assert b.choose(5, [("n1", 4), ("n2", 4)], [4], 2) == ["n1", "n2"]
    assert b.choose(5, [("n1", 4)], [], 2) is None  # not a whole batch yet


def test_choose_waits_when_the_later_steps_could_not_hold_what_is_due():
    b = StalenessBound(2)
    # step 5, 1 a step: pending version 3 (due 6) and ready version 3 and 4 (due 6, 7). Taking the version-4
    # group now would leave two groups due by step 6 for one slot: wait instead
    assert b.choose(5, [("a", 4)], [3, 3], 1) is None
    assert b.choose(5, [("a", 4), ("b", 3)], [3], 1) == ["b"]


def test_adoption_only_within_the_bound():
    assert StalenessBound(1).adoptable(4, 6) and not StalenessBound(1).adoptable(3, 6)


@pytest.mark.parametrize("k", [-1, 1.5, True, "2"])
def test_bad_bounds_raise_naming_the_key(k):
    with pytest.raises((ValueError, TypeError), match="max_staleness" if k != "2" else ""):
        StalenessBound(k)


def test_dispatch_gives_no_group_to_a_replica_below_the_floor():
    state = DispatchState((ReplicaState(0, 1), ReplicaState(1, 3)))
    plan = plan_dispatch(state, ["g1", "g2", "g3"], 3, DispatchPolicy(groups_per_batch=2), floor=2)
    assert [(a.group_id, a.replica_id) for a in plan.assignments] == [("g1", 1), ("g2", 1)]
    assert plan.waiting == ("g3",)
    # the stale replica's batch has ended: it refreshes to the newest version, after which it takes groups again
    assert [(d.replica_id, d.to_version) for d in plan.refreshes] == [(0, 3)]


def test_dispatch_limit_counts_training_groups_and_validation_is_exempt():
    state = DispatchState((ReplicaState(0, 1), ReplicaState(1, 3)))
    plan = plan_dispatch(state, ["v", "g1", "g2"], 3, DispatchPolicy(groups_per_batch=2), floor=3, limit=1,
                         exempt={"v"})
    assert [(a.group_id, a.replica_id) for a in plan.assignments] == [("v", 1), ("g1", 1)]
    assert plan.waiting == ("g2",)
    # validation ignores the floor too: it runs on any replica with room
    plan = plan_dispatch(state, ["v"], 3, DispatchPolicy(groups_per_batch=1), floor=9, limit=0, exempt={"v"})
    assert [a.group_id for a in plan.assignments] == ["v"]


def _simulate(k: int, seed: int, per_step: int = 2, replicas: int = 3, slots: int = 2, steps: int = 30) -> dict:
    """A discrete-time run: replicas refresh only when their own batch ended (so they lag), groups take a
    heavy-tailed time, the trainer trains ``per_step`` groups a step and publishes after each."""
    rng = random.Random(seed)
    published, step, busy_until = 0, 1, None  # busy_until: the tick the current training step ends
    version = [0] * replicas
    open_on: list[dict[str, tuple[int, int]]] = [{} for _ in range(replicas)]  # group -> (version, done tick)
    ready: list[tuple[str, int]] = []
    lags, made, b = [], 0, StalenessBound(k)
    for tick in range(20_000):
        for r in range(replicas):  # finishes
            for g, (v, done) in list(open_on[r].items()):
                if done <= tick:
                    del open_on[r][g]
                    ready.append((g, v))
            if not open_on[r]:
                version[r] = published  # the batch ended: refresh
        untrained = [v for o in open_on for v, _ in o.values()] + [v for _, v in ready]
        floor, limit = b.admission(step, published, per_step, untrained)
        floor, limit = (-1, 10**9) if floor is None else (floor, limit)
        for r in rng.sample(range(replicas), replicas):  # admissions
            while len(open_on[r]) < slots and limit > 0 and version[r] >= floor:
                length = 1 + (int(rng.paretovariate(1.2)) if rng.random() < 0.3 else rng.randint(0, 2))
                open_on[r][f"g{made}"] = (version[r], tick + length)
                made, limit = made + 1, limit - 1
        if busy_until is not None and tick >= busy_until:
            published, busy_until = step - 1, None  # step s - 1 ended: version s - 1 published
        if busy_until is None:
            pending = [v for o in open_on for v, _ in o.values()]
            chosen = b.choose(step, ready, pending, per_step)
            if chosen is not None:
                lags += [lag(step, v) for g, v in ready if g in chosen]
                ready = [gv for gv in ready if gv[0] not in chosen]
                step, busy_until = step + 1, tick + 2
                if step > steps:
                    return {"lags": lags, "made": made, "left": len(ready) + sum(map(len, open_on)), "tick": tick}
    raise AssertionError(f"deadlock: step {step}, published {published}, ready {ready}, open {open_on}")


@pytest.mark.parametrize("k", [0, 1, 2, 3])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_simulated_long_tail_run_stays_within_k_without_dropping_or_deadlock(k, seed):
    out = _simulate(k, seed)
    assert len(out["lags"]) == 30 * 2  # every step trained a whole batch
    assert max(out["lags"]) <= k, out["lags"]
    assert out["made"] == len(out["lags"]) + out["left"]  # every admitted group is trained or still queued


def test_unbounded_simulated_run_goes_beyond_what_the_bound_allows():
    lags = [max(_simulate(None, seed)["lags"]) for seed in range(3)]
    assert max(lags) > 1, lags  # what the bound has to prevent
