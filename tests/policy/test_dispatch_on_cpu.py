"""Dispatcher policy: whole groups to one replica, refresh only at batch end, version-pinned routing."""

import random

import pytest

from verl_laminar.policy.dispatch import (
    Assignment,
    DispatchError,
    DispatchPlan,
    DispatchPolicy,
    RefreshDecision,
    ReplicaState,
    RoutingError,
    abandon_refresh,
    apply_plan,
    complete_refresh,
    decide_refresh,
    finish_group,
    initial_state,
    mark_dead,
    move_group,
    plan_dispatch,
    route,
)

CFG = DispatchPolicy(groups_per_batch=2)


def dispatch(state, queue, newest=None, cfg=CFG):
    plan = plan_dispatch(state, queue, newest, cfg)
    return apply_plan(state, plan, cfg), plan


@pytest.mark.parametrize(
    "replica,newest,expected,why",
    [
        (ReplicaState(0, 3), 4, RefreshDecision(0, 3, 4), "idle and behind"),
        (ReplicaState(0, 3), 3, None, "already newest"),
        (ReplicaState(0, 3), None, None, "nothing published"),
        (ReplicaState(0, 3, frozenset({"g"}), 1), 4, None, "batch still running"),
        (ReplicaState(0, 3, refreshing_to=4), 5, None, "already loading"),
        (ReplicaState(0, 3, alive=False), 4, None, "dead"),
        (ReplicaState(0, 5), 4, None, "relay behind the replica never downgrades"),
    ],
)
def test_decide_refresh(replica, newest, expected, why):
    assert decide_refresh(replica, newest) == expected, why


def test_groups_fill_newest_then_least_loaded_replica_and_overflow_waits():
    state = initial_state([0, 1], version=0)
    state, _ = dispatch(state, ["a"])
    state = complete_refresh(apply_plan(state, DispatchPlan(refreshes=(RefreshDecision(1, 0, 1),)), CFG), 1, 1)
    state, plan = dispatch(state, ["b", "c", "d", "e"])
    # replica 1 serves version 1: it fills first; replica 0 has one slot left; "e" waits
    assert plan.assignments == (Assignment("b", 1, 1), Assignment("c", 1, 1), Assignment("d", 0, 0))
    assert plan.waiting == ("e",)
    assert state.replica(0).taken == 2 and state.replica(1).open_groups == {"b", "c"}


def test_spread_across_equal_replicas_is_deterministic():
    state, plan = dispatch(initial_state([2, 0, 1], 0), ["a", "b", "c", "d"])
    assert [a.replica_id for a in plan.assignments] == [0, 1, 2, 0]


def test_batch_end_then_refresh_then_next_batch():
    state, _ = dispatch(initial_state([0], 0), ["a", "b"])
    # batch full: even with a newer version, nothing happens until both groups finish
    state, plan = dispatch(state, ["c"], newest=1)
    assert plan.refreshes == () and plan.waiting == ("c",)
    state, ended = finish_group(state, "a")
    assert not ended
    state, ended = finish_group(state, "b")
    assert ended and state.replica(0).taken == 0
    state, plan = dispatch(state, ["c"], newest=1)
    assert plan.refreshes == (RefreshDecision(0, 0, 1),) and plan.waiting == ("c",)
    state = complete_refresh(state, 0, 1)
    state, plan = dispatch(state, ["c"], newest=1)
    assert plan.assignments == (Assignment("c", 0, 1),)


def test_per_replica_newest_from_local_relays():
    state = initial_state([0, 1], 0)
    plan = plan_dispatch(state, [], {0: 2, 1: 0}, CFG)
    assert plan.refreshes == (RefreshDecision(0, 0, 2),)


def test_refreshing_replica_takes_nothing_and_route_refuses():
    state, _ = dispatch(initial_state([0, 1], 0), [], newest={0: 1})
    assert state.replica(0).refreshing_to == 1
    state, plan = dispatch(state, ["a"], newest={0: 1})
    assert plan.assignments == (Assignment("a", 1, 0),)


def test_multi_turn_group_keeps_its_version_across_turns():
    state, _ = dispatch(initial_state([0], 0), ["g"])
    for turn in range(5):
        # a new version appears between tool calls: the open group blocks the refresh
        state, plan = dispatch(state, [], newest=turn + 1)
        assert plan.refreshes == ()
        assert route(state, "g") == Assignment("g", 0, 0)
    state, _ = finish_group(state, "g")
    state, plan = dispatch(state, [], newest=5)
    assert plan.refreshes == (RefreshDecision(0, 0, 5),)


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda s: s, "no assignment"),
        (lambda s: mark_dead(s, 0), "dead replica"),
    ],
)
def test_route_errors_name_the_group(mutate, match):
    state, _ = dispatch(initial_state([0], 0), ["g"])
    state = mutate(state)
    gid = "unknown" if match == "no assignment" else "g"
    with pytest.raises(RoutingError, match=match):
        route(state, gid)


def test_route_detects_a_refresh_under_an_open_group():
    state, _ = dispatch(initial_state([0], 0), ["g"])
    bad = state.__class__(tuple(r.__class__(r.replica_id, 7, r.open_groups, r.taken) for r in state.replicas),
                          state.pins)
    with pytest.raises(RoutingError, match="needs version 0 but replica 0 serves 7"):
        route(bad, "g")


def test_stale_plans_and_double_events_are_rejected():
    state = initial_state([0], 0)
    plan = plan_dispatch(state, ["a", "b"], None, CFG)
    state = apply_plan(state, plan, CFG)
    with pytest.raises(DispatchError, match="already assigned"):
        apply_plan(state, plan, CFG)
    with pytest.raises(DispatchError, match="already assigned"):
        plan_dispatch(state, ["a"], None, CFG)
    with pytest.raises(DispatchError, match="twice"):
        plan_dispatch(state, ["x", "x"], None, CFG)
    state, _ = finish_group(state, "a")
    with pytest.raises(DispatchError, match="not assigned"):
        finish_group(state, "a")
    with pytest.raises(DispatchError, match="refreshing to None"):
        complete_refresh(state, 0, 1)
    with pytest.raises(DispatchError, match="not refreshing"):
        abandon_refresh(state, 0)
    with pytest.raises(DispatchError, match="unknown replica 9"):
        state.replica(9)
    with pytest.raises(ValueError, match="groups_per_batch=0"):
        DispatchPolicy(0)


def test_abandoned_refresh_keeps_old_version():
    state, _ = dispatch(initial_state([0], 3), [], newest=4)
    state = abandon_refresh(state, 0)
    assert state.replica(0).version == 3 and state.replica(0).refreshing_to is None


def test_move_group_only_within_a_version():
    state = initial_state([0, 1, 2], 0)
    state = complete_refresh(apply_plan(state, DispatchPlan(refreshes=(RefreshDecision(2, 0, 1),)), CFG), 2, 1)
    state, _ = dispatch(state, ["a", "b", "c"])  # a,b -> replica 2 (v1); c -> replica 0
    assert route(state, "c").replica_id == 0
    state = move_group(state, "c", 1)
    assert route(state, "c") == Assignment("c", 1, 0)
    assert state.replica(0).batch_ended and state.replica(1).taken == 0
    with pytest.raises(RoutingError, match="same version"):
        move_group(state, "a", 0)


def test_random_schedules_keep_every_group_on_one_version():
    """Property: random arrivals, finishes and publications; no group or turn ever sees two versions."""
    rng = random.Random(0)
    refreshes = routed = 0
    for trial in range(40):
        cfg = DispatchPolicy(rng.randint(1, 4))
        state = initial_state(range(rng.randint(1, 5)), 0)
        queue, submitted, finished, newest = [], 0, set(), 0
        pinned_version: dict[str, int] = {}
        for _ in range(150):
            r = rng.random()
            if r < 0.3:
                queue.append(f"t{trial}g{submitted}")
                submitted += 1
            elif r < 0.4:
                newest += 1
            elif r < 0.6 and state.pins:
                gid = rng.choice(sorted(state.pins))
                assert route(state, gid).version == pinned_version[gid]  # another turn of the agent loop
                routed += 1
            elif r < 0.8 and state.pins:
                gid = rng.choice(sorted(state.pins))
                state, _ = finish_group(state, gid)
                finished.add(gid)
            else:
                for rep in state.replicas:
                    if rep.refreshing_to is not None:
                        state = complete_refresh(state, rep.replica_id, rep.refreshing_to)
            plan = plan_dispatch(state, queue, newest, cfg)
            before = state.versions()
            state = apply_plan(state, plan, cfg)
            refreshes += len(plan.refreshes)
            for d in plan.refreshes:
                assert not any(a.replica_id == d.replica_id for a in state.pins.values()), "refresh under open group"
            for a in plan.assignments:
                pinned_version[a.group_id] = a.version
            queue = list(plan.waiting)
            for rep in state.replicas:
                assert rep.version >= before[rep.replica_id] and rep.taken <= cfg.groups_per_batch
                assert all(state.pins[g].replica_id == rep.replica_id for g in rep.open_groups)
        # nothing lost, nothing twice: every submitted group is queued, open, or finished exactly once
        ids = [f"t{trial}g{i}" for i in range(submitted)]
        places = [(g in queue) + (g in state.pins) + (g in finished) for g in ids]
        assert places == [1] * submitted
    assert refreshes > 100 and routed > 500  # the schedules did exercise refreshes and multi-turn routing


def test_policy_accounting_metrics_and_buffer_import_no_runtime_packages():
    from laminar_testing import run_py

    code = (
        "import sys\n"
        "import verl_laminar.policy.dispatch, verl_laminar.policy.accounting, verl_laminar.metrics\n"
        "import verl_laminar.buffer.experience\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'ray', 'torch', 'vllm', 'verl'})\n"
        "print('HEAVY', heavy)\n"
    )
    out = run_py(code, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout, out.stdout


def test_add_replica_joins_empty_and_takes_moved_groups():
    from verl_laminar.policy.dispatch import add_replica, mark_dead, move_group

    cfg = DispatchPolicy(1)
    s = apply_plan(initial_state([0, 1], 3), plan_dispatch(initial_state([0, 1], 3), ["g"], 3, cfg), cfg)
    dead = s.pins["g"].replica_id
    s = add_replica(mark_dead(s, dead), 7, 3)
    assert s.replica(7).version == 3 and not s.replica(7).open_groups
    s = move_group(s, "g", 7)
    assert route(s, "g").replica_id == 7
    with pytest.raises(DispatchError, match="already known"):
        add_replica(s, 7, 3)
