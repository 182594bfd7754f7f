"""Which versions the relays keep beyond keep_versions (pure policy)."""


import pytest

from verl_laminar.policy.dispatch import DispatchState, ReplicaState
from verl_laminar.policy.holds import hold_plan, versions_to_hold


def _state(*reps):
    return DispatchState(tuple(ReplicaState(rid, v, open_groups=frozenset(g), alive=alive)
                               for rid, v, g, alive in reps))


@pytest.mark.parametrize("reps, published, parked, want", [
    (((0, 3, {"a"}, True), (1, 4, set(), True)), 4, (), {3}),  # a lagging replica with open groups
    (((0, 4, {"a"}, True),), 4, (), set()),  # the newest is kept anyway
    (((0, 3, set(), True),), 4, (), set()),  # its batch ended: it refreshes, nothing to keep
    (((0, 3, {"a"}, False),), 4, (), set()),  # dead: only a parked version counts
    (((0, 3, {"a"}, False),), 4, (3,), {3}),
    (((0, -1, set(), True),), None, (), set()),  # nothing published, an unloaded replacement
])
def test_versions_to_hold(reps, published, parked, want):
    assert versions_to_hold(_state(*reps), published, parked) == want


def test_hold_plan_skips_refusals_unless_the_version_must_be_held():
    assert hold_plan({3, 5}, set(), held={2}, refused={5}) == ([3], [2])
    assert hold_plan({5}, {5}, held=set(), refused={5}) == ([5], [])
    assert hold_plan({3}, set(), held={3}, refused=set()) == ([], [])


@pytest.mark.parametrize("answers, gone, ok, why", [
    ([True, True], [False, False], True, ""),
    ([True, RuntimeError("died")], [False, True], True, "1 relay(s) gone with their machine skipped"),
    ([RuntimeError("died")], [True], False, "no relay is left (1 gone)"),
    ([True, RuntimeError("store unreadable")], [False, False], False, "failed: RuntimeError('store unreadable')"),
    ([True, False], [False, False], False, "no longer on every relay"),
    ([False, RuntimeError("died")], [False, True], False, "no longer on every relay"),
])
def test_a_hold_skips_relays_gone_with_their_machine_and_fails_on_any_other_answer(answers, gone, ok, why):
    from verl_laminar.policy.holds import hold_verdict

    got_ok, got_why = hold_verdict(3, answers, gone)
    assert got_ok is ok and why in got_why
