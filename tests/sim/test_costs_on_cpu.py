"""Cost models against hand-computed values and in the direction each should move, and the simulated chain
against T*(p).

No test here re-checks a calibration (``params.CALIBRATED_FROM_PAPER``): a value chosen to reproduce one of the
paper's numbers reproduces it by construction. The tests check the mechanisms instead: what a cost grows with.
"""

import dataclasses as dc

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
from verl_laminar.sim.params import MODELS

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


def test_train_time_falls_with_trainer_gpus_until_fsdp_traffic_floors_it():
    # one paper step of 72B (512 x 16 trajectories of ~3K tokens) in 16 updates
    tokens, updates = 512 * 16 * 3000.0, 16
    gpus = [32, 64, 128, 256, 512, 1024]
    t = [train_seconds(M72, tokens, g, P, updates) for g in gpus]
    # compute-bound at first: twice the GPUs, half the time
    assert t[1] / t[0] == pytest.approx(0.5) and t[2] / t[1] == pytest.approx(0.5)
    # then every micro-batch moves ~3x the weights per GPU whatever the GPU count: more GPUs stop helping (the
    # (g - 1) / g of a ring even adds a little)
    assert t[3] < t[2]
    assert all(later / earlier == pytest.approx(1.0, abs=0.01) for earlier, later in zip(t[3:], t[4:]))
    floor = updates * P.training.fsdp_comm_factor * M72.weight_bytes * (1024 - 1) / 1024 / \
        (P.network.ib_bandwidth_per_gpu * P.network.nccl_efficiency)
    assert t[-1] == pytest.approx(floor)
    # without that traffic the trainer keeps strong-scaling, so the floor is what stops it
    free = dc.replace(P, training=dc.replace(P.training, fsdp_comm_factor=0.0))
    assert train_seconds(M72, tokens, 1024, free, updates) == pytest.approx(
        train_seconds(M72, tokens, 512, free, updates) / 2)
    # the floor is in the weights: a model twice as large hits it twice as high
    assert train_seconds(_scaled(M72, 2), tokens, 1024, P, updates) == pytest.approx(2 * t[-1], rel=1e-6)


@pytest.mark.parametrize("model,gpus", [(M7, 8), (M32, 16), (M72, 32)])
def test_min_trainer_gpus_hold_16_bytes_per_param_in_half_of_hbm(model, gpus):
    assert min_trainer_gpus(model, P) == gpus


def _scaled(model, k):
    """``model`` with ``k`` times its parameters (and so its weight bytes); the shape is otherwise the same."""
    return dc.replace(model, name=f"{model.name}x{k}", params=model.params * k)


def _net(**kw):
    return dc.replace(P, network=dc.replace(P.network, **kw))


def test_publish_stall_is_linear_in_weight_bytes_and_inverse_in_bandwidth():
    # a hand-off over one link: no fixed term, so twice the bytes take exactly twice as long
    base = publish_stall(M32, P)
    for k in (0.5, 2.0, 4.0):
        assert publish_stall(_scaled(M32, k), P) == pytest.approx(k * base)
    assert publish_stall(M72, P) / publish_stall(M7, P) == pytest.approx(M72.weight_bytes / M7.weight_bytes)
    assert publish_stall(M32, _net(publish_bandwidth=P.network.publish_bandwidth / 2)) == pytest.approx(2 * base)


def _chain_tail(machines, model, p=P):
    return relay_arrivals(relay_plan(machines, model, p), model, p)[-1]


def test_chain_time_grows_with_relays_but_sublinearly():
    tails = [_chain_tail(m, M72) for m in (2, 4, 8, 16, 32, 64, 128)]
    assert tails == sorted(tails) and len(set(tails)) == len(tails)  # every relay more adds a hop
    # pipelining: up to 128 relays the time beyond one copy of the weights grows like the square root of the
    # relay count (T* = W*Tb + (p-2)*Ts + 2*sqrt((p-2)*W*Tb*Ts), the per-hop latency small next to W*Tb), so each
    # doubling of the chain adds well under twice what the previous one added (a cost linear in the relays would
    # add exactly twice), and 126 relays more cost far less than one more copy of the weights (a chain that
    # stored and forwarded whole copies would cost 127 of them)
    steps = [b - a for a, b in zip(tails, tails[1:])]
    assert all(later < 1.5 * earlier for earlier, later in zip(steps, steps[1:]))
    assert tails[-1] < 1.2 * tails[0]
    assert tails[-1] / 128 < tails[0] / 2  # per relay, a long chain is cheaper than a short one


def test_chain_time_grows_with_weight_bytes_at_most_linearly():
    for machines in (4, 128):
        tails = [_chain_tail(machines, m) for m in (M7, M32, M72)]
        assert tails == sorted(tails)
        one, two = _chain_tail(machines, M32), _chain_tail(machines, _scaled(M32, 2))
        assert one < two <= 2 * one + 1e-12  # the per-hop latency does not grow with the bytes
    # and the bytes' share dominates for a large model: the time is close to linear in W there
    assert _chain_tail(16, _scaled(M72, 2)) == pytest.approx(2 * _chain_tail(16, M72), rel=0.1)


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


def test_every_calibrated_input_is_named_and_exists():
    from verl_laminar.sim.params import CALIBRATED_FROM_PAPER

    assert len(set(CALIBRATED_FROM_PAPER)) == len(CALIBRATED_FROM_PAPER)
    for name in CALIBRATED_FROM_PAPER:
        head, *rest = name.split(".")
        roots = list(P.tasks) if head == "tasks" else [getattr(P, head)]
        for obj in roots:
            for part in rest:
                obj = getattr(obj, part)  # AttributeError: a stale name
            assert isinstance(obj, (int, float)), name


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
