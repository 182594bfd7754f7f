"""A dead replica under the dispatcher: its groups move within their version, or are lost (pure policy)."""

import dataclasses
from types import MappingProxyType

import pytest

from verl_laminar.policy.dispatch import (
    Assignment,
    DispatchPolicy,
    DispatchState,
    ReplicaState,
    RoutingError,
    finish_group,
    initial_state,
    plan_dispatch,
    route,
)
from verl_laminar.policy.replica_loss import fail_replica

CFG = DispatchPolicy(groups_per_batch=2)


def state_with(versions, groups):
    """Replicas at ``versions`` (id -> version); ``groups``: group -> the replica it is open on."""
    reps = tuple(ReplicaState(rid, v, open_groups=frozenset(g for g, r in groups.items() if r == rid),
                              taken=sum(r == rid for r in groups.values()))
                 for rid, v in sorted(versions.items()))
    pins = {g: Assignment(g, rid, versions[rid]) for g, rid in groups.items()}
    return DispatchState(reps, MappingProxyType(pins))


@pytest.mark.parametrize("versions,groups,load,moved,lost,why", [
    ({0: 3, 1: 3}, {"a": 0, "b": 0}, {1: 0}, {"a": 1, "b": 1}, (), "a live replica on the same version takes both"),
    ({0: 3, 1: 4}, {"a": 0}, {}, {}, ("a",), "the only live replica is newer: the group cannot keep its version"),
    ({0: 3, 1: 3, 2: 3}, {"a": 0, "b": 0, "c": 2}, {1: 0, 2: 4}, {"a": 1, "b": 1}, (),
     "the least loaded same-version replica, counting the plan's earlier moves"),
    ({0: 3, 1: 3, 2: 3}, {"a": 0, "b": 0}, {1: 2, 2: 2}, {"a": 1, "b": 2}, (), "balanced: one each"),
    ({0: 3}, {"a": 0}, {}, {}, ("a",), "no live replica at all"),
])
def test_fail_replica(versions, groups, load, moved, lost, why):
    state = state_with(versions, groups)
    sizes = {g: 2 for g in groups}
    new, loss = fail_replica(state, 0, sizes, {g: i for i, g in enumerate(groups)}, load, now_s=10.0)
    assert dict(loss.moved) == moved, why
    assert loss.lost == lost, why
    assert not new.replica(0).alive
    for g, rid in moved.items():
        a = route(new, g)
        assert (a.replica_id, a.version) == (rid, versions[0]), why  # same version, new replica
    for g in lost:
        with pytest.raises(RoutingError, match="dead replica"):
            route(new, g)
        new, _ = finish_group(new, g)  # the failed group still ends normally
    # the dead replica takes nothing new and is never refreshed
    plan = plan_dispatch(new, ["z"], 9, CFG)
    assert all(d.replica_id != 0 for d in plan.refreshes) and all(a.replica_id != 0 for a in plan.assignments)


def test_a_refreshing_replica_takes_no_moved_group_and_a_replica_dies_once():
    state = state_with({0: 3, 1: 3}, {"a": 0})
    state = DispatchState(tuple(dataclasses.replace(r, refreshing_to=4) if r.replica_id == 1 else r
                                for r in state.replicas), state.pins)
    new, loss = fail_replica(state, 0, {"a": 2}, {}, {}, now_s=0.0)
    assert loss.lost == ("a",) and loss.moved == ()
    with pytest.raises(RoutingError, match="already dead"):
        fail_replica(new, 0, {}, {}, {}, now_s=0.0)


def test_an_idle_replica_dies_with_nothing_to_move():
    new, loss = fail_replica(initial_state([0, 1], 2), 1, {}, {}, {}, now_s=0.0)
    assert (loss.moved, loss.lost) == ((), ()) and not new.replica(1).alive and new.replica(0).alive


def test_a_fully_generated_group_is_neither_moved_nor_lost():
    """Its rewards are still being computed when the replica dies: it needs no replica, and losing it would
    discard trajectories that verl trains anyway (an e2e run failed exactly so)."""
    state = state_with({0: 3, 1: 4}, {"done": 0, "open": 0})
    new, loss = fail_replica(state, 0, {"done": 2, "open": 2}, {}, {}, now_s=1.0, complete={"done"})
    assert loss.lost == ("open",) and loss.moved == () and loss.complete == ("done",)
    assert new.pins["done"].replica_id == 0  # still pinned: finish_group ends it normally
    new, _ = finish_group(new, "done")
    assert "done" not in new.pins


def test_with_a_replacement_coming_a_group_no_live_replica_serves_is_parked_on_its_version():
    state = state_with({0: 3, 1: 4, 2: 3}, {"a": 0, "b": 0, "c": 1})
    new, loss = fail_replica(state, 0, {"a": 2, "b": 2}, {}, {2: 9}, now_s=1.0, park=True)
    assert loss.moved == (("a", 2), ("b", 2)) and loss.parked == () and loss.parked_version is None  # moved first
    state = state_with({0: 3, 1: 4}, {"a": 0, "b": 0, "done": 0})
    new, loss = fail_replica(state, 0, {"a": 2, "b": 2, "done": 2}, {}, {}, now_s=1.0, park=True, complete={"done"})
    assert (loss.parked, loss.parked_version, loss.lost, loss.complete) == (("a", "b"), 3, (), ("done",))
    assert new.pins["a"].replica_id == 0 and not new.replica(0).alive  # pinned to the dead one until adopted
    _, loss = fail_replica(state, 0, {"a": 2, "b": 2}, {}, {}, now_s=1.0, park=False)
    assert (loss.parked, loss.lost) == ((), ("a", "b", "done"))


def test_a_replica_that_adopts_parked_groups_closes_its_batch_then_refreshes_when_they_finish():
    from verl_laminar.policy.dispatch import (
        DispatchPlan,
        RefreshDecision,
        add_replica,
        apply_plan,
        close_batch,
        complete_refresh,
        move_group,
    )

    state = state_with({0: 3, 1: 4}, {"a": 0})
    state, loss = fail_replica(state, 0, {"a": 2}, {}, {}, now_s=1.0, park=True)
    state = add_replica(state, 2, -1)
    state = apply_plan(state, DispatchPlan(refreshes=(RefreshDecision(2, -1, 3),)), CFG)  # the parked version
    state = complete_refresh(state, 2, 3)
    state = close_batch(move_group(state, "a", 2), 2, CFG)
    plan = plan_dispatch(state, ["z"], 4, CFG)
    assert [a.replica_id for a in plan.assignments] == [1]  # nothing new on the old version
    state, ended = finish_group(state, "a")
    assert ended and plan_dispatch(state, [], 4, CFG).refreshes == (RefreshDecision(2, 3, 4),)
