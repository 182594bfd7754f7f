"""The trainer/rollout split policy: which splits fit (whole nodes, replicas of the TP size, the training state's
memory, verl's batch checks), which one the cost model picks, and each refusal's reason."""

from __future__ import annotations

import dataclasses

import pytest

from verl_laminar.policy.roofline import H100, ModelShape
from verl_laminar.policy.split import (
    DECODE_EFFICIENCY,
    SplitError,
    SplitRequest,
    TrainingCost,
    Workload,
    candidates,
    check_devices,
    min_trainer_gpus,
    plan_split,
    rollout_seconds,
    train_seconds,
)

TINY = ModelShape("tiny", params=2.0e6, layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, vocab=1000)
Q7 = ModelShape("7b", params=7.62e9, layers=28, hidden=3584, heads=28, kv_heads=4, head_dim=128, vocab=152064)
SHORT = Workload(sequences=5120, prompt_tokens=512, response_tokens=512, updates=4, kv_memory_fraction=0.6)


def test_cpu_platform_two_logical_gpus_split_one_and_one():
    """The CPU sync recipe (2 ranks, TP 1, colocated) under +laminar=enabled: 1 trainer rank + 1 replica."""
    r = SplitRequest(nodes=1, gpus_per_node=2, replica_gpus=1, trainer_floor=1, batch_divisors=(32, 32))
    s = plan_split(r, TINY, H100, 1, Workload(sequences=32, prompt_tokens=64, response_tokens=64, updates=1))
    assert (s.trainer_nodes, s.trainer_gpus_per_node, s.rollout_nodes, s.rollout_gpus_per_node, s.replicas) == \
        (1, 1, 1, 1, 1)
    assert s.overrides() == ["actor_rollout_ref.hybrid_engine=False", "trainer.nnodes=1", "trainer.n_gpus_per_node=1",
                             "actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.n_gpus_per_node=1"]


@pytest.mark.parametrize("request_, match", [
    (SplitRequest(1, 1, 1, 1), "1 GPU: Laminar needs at least one trainer GPU"),
    (SplitRequest(1, 8, 8, 1), "TP=8 takes all 8 GPUs of the one node"),
    (SplitRequest(2, 8, 8, 14), "needs 14 GPUs .* 22 > the 16 GPUs"),
    (SplitRequest(2, 8, 16, 1), "replica of 16 GPUs .* does not fit whole on a node of 8"),
    (SplitRequest(1, 8, 2, 1, batch_divisors=(7,)), "passes verl's batch checks"),
])
def test_refusals_name_the_reason_and_a_fix(request_, match):
    with pytest.raises(SplitError, match=match) as e:
        plan_split(request_, TINY, H100, request_.replica_gpus, SHORT)
    assert e.value.fix  # every refusal says what to change


def test_device_refusals_come_before_anything_is_known_of_the_model():
    with pytest.raises(SplitError, match="1 GPU"):
        check_devices(1, 1, 1)
    with pytest.raises(SplitError, match="leaves no trainer GPU"):
        check_devices(1, 8, 8)
    check_devices(1, 2, 1)  # the CPU platform's 2 logical GPUs: 1 + 1 fits


def test_whole_nodes_first_then_the_same_split_on_every_node():
    whole = candidates(SplitRequest(4, 8, 2, 4))
    assert [(s.trainer_nodes, s.rollout_nodes, s.whole_nodes) for s in whole] == [(1, 3, True), (2, 2, True),
                                                                                  (3, 1, True)]
    # a 9-GPU trainer does not fit one of two nodes: 6 GPUs of each train, 2 of each hold one TP-2 replica
    per_node = candidates(SplitRequest(2, 8, 2, 9))
    assert [(s.trainer_nodes, s.trainer_gpus_per_node, s.rollout_gpus_per_node, s.replicas) for s in per_node] == \
        [(2, 6, 2, 2)]
    # on one node: the trainer takes k GPUs, the rest hold whole TP-2 replicas
    one = candidates(SplitRequest(1, 8, 2, 1))
    assert [(s.trainer_gpus, s.replicas) for s in one] == [(2, 3), (4, 2), (6, 1)]


def test_verls_batch_checks_and_sequence_parallelism_remove_candidates():
    # 1024 prompts x 5: 6 trainer GPUs do not divide 5120 (verl's validate_config would stop the run)
    assert [s.trainer_gpus for s in candidates(SplitRequest(1, 8, 2, 4, batch_divisors=(5120,)))] == [4]
    assert [s.trainer_gpus for s in candidates(SplitRequest(1, 8, 1, 1, trainer_multiple=4))] == [4]


def test_the_cost_model_moves_the_split_toward_the_slower_side():
    r = SplitRequest(16, 8, 2, 4, batch_divisors=(5120,))
    short = plan_split(r, Q7, H100, 2, SHORT)  # 1K-token responses: training is the slow side
    long_ = plan_split(r, Q7, H100, 2, dataclasses.replace(SHORT, sequences=512, response_tokens=16384))
    assert short.trainer_gpus == 80 and short.train_s > short.rollout_s  # the largest trainer verl's checks allow
    # 16K-token responses: generation is slow; the best split is an interior one near the balance of the two
    assert 8 < long_.trainer_gpus < 80 and long_.trainer_gpus < short.trainer_gpus
    assert dict(short.tried)[short.trainer_gpus] == max(v for _, v in short.tried)  # the best estimate is chosen


def test_memory_floor_follows_offload():
    assert min_trainer_gpus(7.62e9, 80e9) == 4  # 16 B/param within half of 80 GB
    assert min_trainer_gpus(32.8e9, 80e9) == 14
    assert min_trainer_gpus(32.8e9, 80e9, state_bytes_per_param=8.0) == 7  # optimizer states offloaded
    assert min_trainer_gpus(1e6, 80e9) == 1


def test_a_replica_that_cannot_hold_the_weights_is_refused():
    with pytest.raises(SplitError, match="cannot hold"):
        rollout_seconds(Q7, H100, 1, 1, dataclasses.replace(SHORT, kv_memory_fraction=0.1))


def test_the_simulator_prices_training_and_decoding_with_the_same_functions_and_numbers():
    from verl_laminar.sim import costs
    from verl_laminar.sim.params import DEFAULT_PARAMS, QWEN25_7B

    p = DEFAULT_PARAMS
    assert costs.training_cost(p) == TrainingCost()  # the policy's defaults are the simulator's
    assert p.inference.efficiency == DECODE_EFFICIENCY
    for gpus in (1, 8, 64):
        assert costs.train_seconds(QWEN25_7B, 1e6, gpus, p, 4) == \
            train_seconds(QWEN25_7B, 1e6, gpus, p.device, p.network.gpus_per_machine, TrainingCost(), 4)
    assert costs.min_trainer_gpus(QWEN25_7B, p) == 8  # whole machines of the policy's floor (4 GPUs)
