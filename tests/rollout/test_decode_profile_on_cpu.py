"""repack's B on a CPU host from a decode profile of the run's own replica (``rollout.decode_profile``): the
measurement loop and the rule on synthetic step times; the run against a real vLLM replica is in the tool-calling
e2e (its log names the B it measured)."""

from __future__ import annotations

import pytest

from verl_laminar.policy.roofline import crossover_batch_from_profile
from verl_laminar.rollout.decode_profile import ProfilePlan, measure


def _engine(per_step_s, prefill_s: float = 0.5):
    """``run(b, n)`` of an engine whose decode step with b sequences costs ``per_step_s(b)``; records its calls."""
    calls = []

    def run(b: int, n: int) -> float:
        calls.append((b, n))
        return prefill_s * b + n * per_step_s(b)

    return run, calls


def test_the_profile_is_free_of_prefill_and_warm_up():
    run, calls = _engine(lambda b: 0.020 + 0.001 * b)
    plan = ProfilePlan(batches=(1, 2, 4, 8), t_short=4, t_long=20, repeats=3)
    profile = measure(run, plan)
    assert profile == pytest.approx({b: 0.020 + 0.001 * b for b in plan.batches})
    assert calls[0] == (1, 4) and len(calls) == 1 + len(plan.batches) * plan.repeats * 2  # warm-up, then pairs


def test_b_is_where_the_compute_slope_reaches_the_single_sequence_step():
    # flat (memory-bound) to 8, then every sequence adds 5 ms: 5 ms * b <= 21 ms up to b = 4
    profile = {1: 0.021, 2: 0.021, 4: 0.022, 8: 0.030, 16: 0.070}
    assert crossover_batch_from_profile(profile) == 4
    # still flat at the largest batch profiled: B is at least that
    assert crossover_batch_from_profile({1: 0.02, 2: 0.02, 4: 0.02, 8: 0.02}) == 8
    # compute-bound from the start: nothing is merged
    assert crossover_batch_from_profile({1: 0.01, 2: 0.02, 4: 0.04, 8: 0.08}) == 1


def test_a_median_of_repeats_rides_out_one_slow_sample():
    slow = iter([False] * 3 + [True] + [False] * 100)  # the long run of batch 1's second repeat: a busy neighbour
    run, _ = _engine(lambda b: 0.02 * (10 if next(slow) else 1))
    profile = measure(run, ProfilePlan(batches=(1, 2, 4), repeats=3))
    assert profile == pytest.approx({1: 0.02, 2: 0.02, 4: 0.02})


def test_plans_refuse_what_cannot_give_a_slope():
    assert ProfilePlan().capped(8).batches == (1, 2, 4, 8)
    with pytest.raises(ValueError, match=r"max_num_seqs=2: .* set laminar.repack.max_batch_b"):
        ProfilePlan().capped(2)
    with pytest.raises(ValueError, match="t_long"):
        measure(lambda b, n: 1.0, ProfilePlan(t_short=8, t_long=8))
