"""Cost models against hand-computed values, and the simulated chain against T*(p)."""

import pytest

from verl_laminar.policy.chain import best_chunks, chain_time, t_star
from verl_laminar.sim.costs import (
    colocate_switch,
    g2g_broadcast,
    min_trainer_gpus,
    pcie_load,
    publish_stall,
    relay_arrivals,
    relay_plan,
    rollout_costs,
    train_seconds,
)
from verl_laminar.sim.params import DEFAULT_PARAMS as P
from verl_laminar.sim.params import MODELS, P99_OVER_MEDIAN_SIGMA

M7, M32, M72 = MODELS["7b"], MODELS["32b"], MODELS["72b"]


@pytest.mark.parametrize(
    "model,tp,expected",
    [
        # tp * (80 GB * 0.8 - 4 GB) - weights, over KV bytes per token
        (M7, 1, (80e9 * 0.8 - 4e9 - 7.62e9 * 2) // 57344),
        (M32, 4, (4 * (80e9 * 0.8 - 4e9) - 32.8e9 * 2) // 262144),
        (M72, 8, (8 * (80e9 * 0.8 - 4e9) - 72.7e9 * 2) // 327680),
    ],
)
def test_kv_capacity(model, tp, expected):
    assert rollout_costs(model, tp, P).kv_capacity == int(expected)


def test_a_model_that_does_not_fit_raises():
    with pytest.raises(ValueError, match="raise tp"):
        rollout_costs(M72, 1, P)


@pytest.mark.parametrize("model,tokens,gpus", [(M7, 1e6, 8), (M32, 2e7, 64), (M72, 2e7, 512)])
def test_train_time_is_6_params_flops_at_mfu(model, tokens, gpus):
    expected = 6 * model.params * tokens / (gpus * 989.5e12 * 0.35)
    assert train_seconds(model, tokens, gpus, P) == pytest.approx(expected)


@pytest.mark.parametrize("model,gpus", [(M7, 8), (M32, 16), (M72, 32)])
def test_min_trainer_gpus_hold_16_bytes_per_param_in_half_of_hbm(model, gpus):
    assert min_trainer_gpus(model, P) == gpus


@pytest.mark.parametrize("model,paper_s", [(M32, 0.64), (M72, 1.40)])
def test_publish_stall_matches_the_papers_measurement(model, paper_s):
    assert publish_stall(model, P) == pytest.approx(paper_s, rel=0.06)


@pytest.mark.parametrize("machines", [2, 3, 16, 128])
def test_simulated_chain_reaches_the_tail_in_chain_time_close_to_t_star(machines):
    plan = relay_plan(machines, M72, P)
    arr = relay_arrivals(plan, M72, P)
    W, Tb, Ts = M72.weight_bytes, 1 / P.network.relay_bandwidth, P.network.relay_msg_latency_s
    c = best_chunks(machines, W, Tb, Ts)
    assert plan.chunks == c
    assert arr[0] == 0.0 and arr == sorted(arr)
    assert arr[-1] == pytest.approx(chain_time(machines, c, W, Tb, Ts))
    assert t_star(machines, W, Tb, Ts) <= arr[-1] <= t_star(machines, W, Tb, Ts) * 1.001


def test_72b_reaches_127_relays_in_under_1_6_s():
    plan = relay_plan(128, M72, P)  # master + 127 relays
    assert relay_arrivals(plan, M72, P)[-1] < 1.6


def test_pcie_and_g2g_hand_computed():
    assert pcie_load(M32, 4, P) == pytest.approx(32.8e9 * 2 / 4 / (64e9 * 0.8) + 0.3)
    W = 32.8e9 * 2 / 4
    expected = t_star(17, W, 1 / (50e9 * 0.8), 20e-6) + 0.5
    assert g2g_broadcast(M32, 4, 16, P) == pytest.approx(expected)
    assert g2g_broadcast(M32, 4, 0, P) == 0.0
    assert colocate_switch(M7, 1, P) == pytest.approx(7.62e9 * 2 / (64e9 * 0.8) + 1.0)


def test_repack_batch_is_the_roofline_ridge():
    c = rollout_costs(M32, 4, P)
    # the datasheet ridge, as the paper takes B: peak / bandwidth = 989.5 / 3.35 ~= 295.4
    assert c.repack_batch == 296


def test_tail_sigma_gives_p99_ten_times_median():
    from math import exp

    assert exp(2.3263478740408408 * P99_OVER_MEDIAN_SIGMA) == pytest.approx(10.0)


@pytest.mark.parametrize("model,tp", [(M7, 1), (M32, 4), (M72, 8)])
def test_prefill_adds_causal_attention_over_the_prefix(model, tp):
    c = rollout_costs(model, tp, P)
    peak = tp * 989.5e12 * 0.6
    mm = model.params - model.vocab * model.hidden  # the embedding is a lookup
    lhd = model.layers * model.heads * model.head_dim
    # rebuilding a 16K-token cache: 2 * matmul params FLOPs per token + 2 * lhd * L^2 for QK^T and AV
    L = 16384
    assert c.prefill_seconds(L, L) == pytest.approx((2 * mm * L + 2 * lhd * L * L) / peak)
    # 100 new tokens after 1,000 cached: each attends to ~1,050 positions on average (the prefix grows
    # from 1,000 to 1,100; continuous, as the decode roofline), 4 * lhd FLOPs per position
    assert c.prefill_seconds(100, 1100) == pytest.approx((2 * mm * 100 + 4 * lhd * 1050 * 100) / peak)
    assert c.prefill_seconds(0, 500) == 0.0


def test_attention_share_of_a_16k_rebuild_on_7b():
    # 2 * 28 * 28 * 128 * 16384 / (2 * 7.075e9) = 23%
    c = rollout_costs(M7, 1, P)
    share = c.prefill_seconds(16384, 16384) / (c.prefill_s_per_token * 16384) - 1
    assert share == pytest.approx(0.2325, abs=1e-3)


def test_g2g_full_weights_from_rank0_is_opt_in_and_hand_computed():
    """AReaL's and verl's wiring: rank 0 sends all W bytes down one chain through every rollout GPU."""
    import dataclasses as dc

    full = dc.replace(P, network=dc.replace(P.network, g2g_full_weights=True))
    assert P.network.g2g_full_weights is False  # the default keeps the per-shard broadcast
    bw = 50e9 * 0.8
    # 32B, 16 rollouts of 4 GPUs: 65 members, 65.6 GB per hop
    expected = t_star(16 * 4 + 1, 32.8e9 * 2, 1 / bw, 20e-6) + 0.5
    assert g2g_broadcast(M32, 4, 16, full) == pytest.approx(expected)
    assert g2g_broadcast(M32, 4, 16, full) > g2g_broadcast(M32, 4, 16, P) + 1.0  # ~1.64 s vs ~0.41 s of transfer
    assert g2g_broadcast(M32, 4, 0, full) == 0.0
    # one GPU per rollout (7B): the two wirings coincide
    assert g2g_broadcast(M7, 1, 64, full) == pytest.approx(g2g_broadcast(M7, 1, 64, P))
