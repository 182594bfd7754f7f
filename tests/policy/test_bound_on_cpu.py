"""laminar.buffer.max_staleness as pure policy (policy.bound): the admission floor, the groups a publication waits
for, adoption within the bound, and the errors for bad values."""

from __future__ import annotations

import pytest

from verl_laminar.policy.bound import StalenessBound
from verl_laminar.policy.dispatch import Assignment, DispatchPolicy, DispatchState, ReplicaState, plan_dispatch


def test_unbounded_admits_everything_and_waits_for_nothing():
    b = StalenessBound(None)
    assert not b.on and b.floor(5) is None and b.floor(5, 6) is None
    assert b.blockers({"g": Assignment("g", 0, 0)}, 9) == [] and b.adoptable(0, 9)


def test_floor_is_published_minus_k_and_while_publishing_the_next_version_minus_k():
    b = StalenessBound(2)
    assert b.floor(None) is None  # nothing published: no replica holds weights anyway
    assert b.floor(5) == 3 and b.floor(5, 6) == 4
    assert StalenessBound(0).floor(5, 6) == 6  # k = 0: nothing is admitted until version 6 is out


def test_blockers_are_the_open_training_groups_older_than_version_minus_k_oldest_first():
    pins = {"a": Assignment("a", 0, 3), "b": Assignment("b", 1, 1), "c": Assignment("c", 1, 2), "v": Assignment("v", 0, 0)}
    assert [a.group_id for a in StalenessBound(1).blockers(pins, 4, skip={"v"})] == ["b", "c"]
    assert StalenessBound(1).blockers(pins, 3, skip={"v"})[0].group_id == "b"
    assert StalenessBound(3).blockers(pins, 4, skip={"v"}) == []


def test_adoption_only_within_the_bound():
    assert StalenessBound(1).adoptable(4, 5) and not StalenessBound(1).adoptable(3, 5)


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
