"""Roofline decode cost: hand-computed values, the compute-bound batch B, and exact integration."""

import math

import pytest

from verl_laminar.policy.roofline import (
    DEVICES,
    H100,
    H200,
    H800,
    DecodeCost,
    Efficiency,
    ModelShape,
    compute_bound_batch,
    decode_cost,
    decode_step_time,
    prefill_time,
)

QWEN7B = ModelShape("qwen2.5-7b", params=7.62e9, layers=28, hidden=3584, heads=28, kv_heads=4, head_dim=128, vocab=152064)
QWEN32B = ModelShape("qwen2.5-32b", params=32.8e9, layers=64, hidden=5120, heads=40, kv_heads=8, head_dim=128, vocab=152064)
IDEAL = Efficiency(bandwidth=1.0, compute=1.0, step_overhead_s=0.0, allreduce_latency_s=0.0, kv_bandwidth=1.0)


@pytest.mark.parametrize("model,kv", [(QWEN7B, 2 * 28 * 4 * 128 * 2), (QWEN32B, 2 * 64 * 8 * 128 * 2)])
def test_kv_bytes_per_token(model, kv):
    assert model.kv_bytes_per_token == kv


@pytest.mark.parametrize(
    "batch,ctx,expected",
    [
        # memory-bound: (weights + KV) bytes over bandwidth
        (1, 0, (7.62e9 - 152064 * 3584) * 2 / 3.35e12),
        (64, 64 * 4096, ((7.62e9 - 152064 * 3584) * 2 + 64 * 4096 * 57344) / 3.35e12),
        # compute-bound: 2 FLOPs per matmul weight per sequence (+ attention) over peak
        (4096, 0, 2 * (7.62e9 - 152064 * 3584) * 4096 / 989.5e12),
    ],
)
def test_decode_step_time_hand_computed(batch, ctx, expected):
    got = decode_step_time(QWEN7B, H800, batch, ctx, tp=1, eff=IDEAL)
    assert got == pytest.approx(expected, rel=1e-9)


def test_small_batch_costs_about_as_much_as_batch_64():
    # Step 1 of the paper: fewer than 8 sequences take nearly as long per step as 64 (short context)
    t8 = decode_step_time(QWEN7B, H800, 8, 8 * 512)
    t64 = decode_step_time(QWEN7B, H800, 64, 64 * 512)
    assert 0.75 < t8 / t64 <= 1.0


def test_tensor_parallel_shortens_a_step_less_than_linearly():
    t1 = decode_step_time(QWEN32B, H800, 32, 32 * 2048, tp=1)
    t4 = decode_step_time(QWEN32B, H800, 32, 32 * 2048, tp=4)
    assert t4 < t1 and t1 / t4 < 4.0


@pytest.mark.parametrize("device", [H800, H100, H200])
def test_compute_bound_batch_is_the_ridge_point(device):
    b = compute_bound_batch(QWEN7B, device, eff=IDEAL)
    # arithmetic intensity of a bf16 GEMV is one FLOP per byte per sequence: B = peak / bandwidth
    assert b == math.ceil(device.peak_flops / device.hbm_bandwidth)
    cost = decode_cost(QWEN7B, device, eff=IDEAL)
    assert cost.flop_per_seq * b >= cost.mem0 > cost.flop_per_seq * (b - 1)


def test_compute_bound_batch_grows_with_context_and_caps():
    b0 = compute_bound_batch(QWEN7B, H800)
    b1 = compute_bound_batch(QWEN7B, H800, ctx_per_seq=200)
    assert b1 > b0
    assert compute_bound_batch(QWEN7B, H800, ctx_per_seq=8192, cap=1234) == 1234  # GQA cache reads never turn compute-bound


def test_h200_bandwidth_makes_decode_faster():
    assert decode_step_time(QWEN7B, H200, 16, 16 * 1000) < decode_step_time(QWEN7B, H800, 16, 16 * 1000)
    assert set(DEVICES) == {"H800", "H100", "H200"}


@pytest.mark.parametrize("n,ctx,steps", [(1, 100, 10), (64, 64 * 300, 5000), (4000, 4000 * 50, 300), (700, 10, 20000)])
def test_span_matches_step_by_step_sum(n, ctx, steps):
    cost = decode_cost(QWEN7B, H800)
    walk = sum(cost.step(n, ctx + n * (k + 0.5)) for k in range(steps))  # midpoint of each step
    assert cost.span(n, ctx, steps) == pytest.approx(walk, rel=1e-6)


@pytest.mark.parametrize("n,ctx,seconds", [(1, 0, 0.5), (64, 10_000, 3.0), (3000, 1e5, 10.0)])
def test_steps_within_inverts_span(n, ctx, seconds):
    cost = decode_cost(QWEN7B, H800)
    steps = cost.steps_within(n, ctx, seconds)
    assert cost.span(n, ctx, steps) == pytest.approx(seconds, rel=1e-7)


def test_prefill_is_compute_bound_for_long_prompts():
    t = prefill_time(QWEN7B, H800, 8192, eff=IDEAL)
    assert t == pytest.approx(2 * (7.62e9 - 152064 * 3584) * 8192 / 989.5e12)
    assert prefill_time(QWEN7B, H800, 0) == 0.0


@pytest.mark.parametrize("bad", [dict(bandwidth=0), dict(compute=1.5), dict(step_overhead_s=-1)])
def test_efficiency_rejects_nonsense(bad):
    with pytest.raises(ValueError):
        Efficiency(**bad)


def test_decode_cost_rejects_bad_tp():
    with pytest.raises(ValueError):
        decode_cost(QWEN7B, H800, tp=0)
    assert isinstance(decode_cost(QWEN7B, H800, tp=2), DecodeCost)


def test_batch_from_a_measured_profile():
    from verl_laminar.policy.roofline import batch_from_profile

    flat_then_rising = {1: 10.0, 2: 10.2, 4: 10.9, 8: 12.4, 16: 15.0, 32: 24.0, 64: 12.0}
    assert batch_from_profile(flat_then_rising, tolerance=0.25) == 8  # 64's odd dip does not count
    assert batch_from_profile({1: 1.0}) == 1
    with pytest.raises(ValueError, match="batch size 1"):
        batch_from_profile({2: 1.0, 4: 1.0})


@pytest.mark.parametrize(
    "profile,expected",
    [
        # measured on vLLM-CPU (ms): slope (77.4-39.1)/8 = 4.8 ms per sequence; 4.8 * 4 <= 21.3 < 4.8 * 8
        ({1: 21.3, 2: 31.1, 4: 38.0, 8: 39.1, 16: 77.4}, 4),
        # a GPU-like profile, flat to 64 then linear: slope 0.5, t1 = 30 -> 60 would be the crossover; 32 profiled
        ({1: 30.0, 2: 30.0, 8: 30.1, 32: 30.5, 64: 32.0, 128: 64.0}, 32),
        # still flat at the largest batch: B is at least that batch
        ({1: 10.0, 4: 10.0, 16: 10.0}, 16),
        # compute-bound from the start (t doubles with b): B = 1
        ({1: 10.0, 2: 20.0, 4: 40.0}, 1),
    ],
)
def test_crossover_batch_from_profile(profile, expected):
    from verl_laminar.policy.roofline import crossover_batch_from_profile

    assert crossover_batch_from_profile(profile) == expected


def test_crossover_batch_needs_a_slope():
    from verl_laminar.policy.roofline import crossover_batch_from_profile

    with pytest.raises(ValueError, match="batch size 1"):
        crossover_batch_from_profile({2: 1.0, 4: 1.0, 8: 2.0})
    with pytest.raises(ValueError, match="at least 3"):
        crossover_batch_from_profile({1: 1.0, 2: 1.5})
