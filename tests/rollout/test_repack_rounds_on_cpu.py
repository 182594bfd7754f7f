"""Repack bookkeeping between the planner and an executor: applying moves to the dispatcher state, counters."""

import pytest

from verl_laminar.policy.dispatch import DispatchPolicy, apply_plan, initial_state, plan_dispatch, route
from verl_laminar.policy.repack import Migration, RepackPolicy
from verl_laminar.rollout.repack import RepackRounds, apply_moves

CFG = DispatchPolicy(groups_per_batch=1)


def fleet():
    """Three replicas on version 0, each holding one group (its whole batch)."""
    state = initial_state([0, 1, 2], 0)
    return apply_plan(state, plan_dispatch(state, ["g0", "g1", "g2"], 0, CFG), CFG)


def test_applied_move_repoints_the_sources_groups_and_ends_its_batch():
    state = fleet()
    src = route(state, "g0").replica_id
    dst = route(state, "g1").replica_id
    new, applied = apply_moves(state, [Migration(src, dst, 0, (1, 2), 100)], CFG)
    assert applied == [Migration(src, dst, 0, (1, 2), 100)]
    assert route(new, "g0").replica_id == dst and route(new, "g0").version == 0
    assert new.replica(src).batch_ended and new.replica(dst).open_groups == {"g0", "g1"}


@pytest.mark.parametrize(
    "why,migration",
    [
        ("version changed since the readings", Migration(0, 1, 7, (1,), 10)),
        ("target is the source", Migration(0, 0, 0, (1,), 10)),
    ],
)
def test_moves_that_no_longer_hold_are_skipped(why, migration):
    state = fleet()
    new, applied = apply_moves(state, [migration], CFG)
    assert (new, applied) == (state, []), why


def test_target_that_finished_its_own_batch_receives_nothing():
    from verl_laminar.policy.dispatch import finish_group

    src, dst = route(fleet(), "g0").replica_id, route(fleet(), "g1").replica_id
    state, _ = finish_group(fleet(), "g1")
    new, applied = apply_moves(state, [Migration(src, dst, 0, (1,), 10)], CFG)
    assert applied == [] and new == state


def test_rounds_count_moves_and_kv_after_on_busy_replicas():
    rounds = RepackRounds(RepackPolicy(c_max=0.99, max_batch=8))
    readings = [{"replica_id": i, "kv_used": u} for i, u in enumerate((0.1, 0.3, 0.5))]
    rounds.record([Migration(0, 1, 0, (1, 2), 100)], 0.02, readings)
    m = rounds.metrics.as_dict()
    assert m["laminar/repack/migrations"] == 1 and m["laminar/repack/sequences_moved"] == 2
    assert m["laminar/repack/kv_use_after"] == pytest.approx((0.4 + 0.5) / 2)  # replica 0 is empty now
    assert m["laminar/repack/seconds"] == pytest.approx(0.02)
    assert m["laminar/repack/requests_not_aborted"] == 0
    rounds.record([], 1.0, readings)  # a round that moved nothing does not count
    assert rounds.metrics.as_dict()["laminar/repack/migrations"] == 1
    rounds.record([Migration(1, 2, 0, (3,), 50)], 0.01, readings, not_aborted=1)
    assert rounds.metrics.as_dict()["laminar/repack/requests_not_aborted"] == 1
