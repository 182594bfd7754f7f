"""Which of a colocated recipe's GPUs train and which generate (pure: no ray/torch/vllm/verl).

A verl recipe with ``actor_rollout_ref.hybrid_engine=True`` gives ``nodes x gpus_per_node`` GPUs to one colocated
worker group. Laminar's rollouts are standalone replicas that never pause for training, so the GPUs are split:

* candidates: whole nodes for the trainer and the rest for the rollouts when there are two nodes or more; on one
  node (or when no whole-node split fits) the same ``k`` trainer GPUs on every node, the rest of each node for
  rollouts. Rollout GPUs per node must hold whole replicas of ``replica_gpus`` (a replica's TP group stays on one
  machine). The trainer must hold the model's training state (``min_trainer_gpus``) and pass verl's batch checks
  (``SplitRequest.batch_divisors``: verl's ``validate_config`` and the train step's mini-batch assert).
* choice: the candidate with the highest estimated throughput of the asynchronous pipeline, ``tokens per step /
  max(train time, generation time)``: Laminar overlaps the two, so the slower side sets the pace. Train time is
  ``train_seconds`` and generation time ``rollout_seconds``, the same functions (and, by a test, the same numbers)
  the cluster simulator prices every system with (``sim.costs``); the simulator's planner (``sim plan``) adds the
  event-level simulation on top, which a run's start cannot afford.

Everything returns a plan (``Split``) or raises ``SplitError`` whose message names the reason and the fix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from verl_laminar.policy.roofline import DeviceSpec, Efficiency, ModelShape, decode_cost, prefill_time


@dataclass(frozen=True)
class TrainingCost:
    """What training costs; the simulator's ``sim.params.Training`` / ``Network`` carry the same defaults."""

    mfu: float = 0.35  # dense training reaches ~40-47% MFU on H100 (Megatron-LM); RL batches less -- assumption
    flops_per_param_token: float = 6.0  # forward + backward (Kaplan et al. 2020)
    state_bytes_per_param: float = 16.0  # fp32 params + grads + Adam m/v, sharded by FSDP (ZeRO, 2020)
    state_memory_fraction: float = 0.5  # at most half of HBM for states, the rest for activations -- assumption
    fsdp_comm_factor: float = 3.0  # all-gather forward + backward, reduce-scatter grads: ~3x weights (ZeRO-3)
    micro_batch_tokens: int = 16384  # verl's ppo_max_token_len_per_gpu default
    ib_bandwidth_per_gpu: float = 50e9  # 8 x 400 Gb/s NICs per 8-GPU machine
    nccl_efficiency: float = 0.8  # nccl-tests bus bandwidth over 400G InfiniBand reaches ~40 of 50 GB/s


# Decode efficiency shared with the simulator (sim.params.DECODE_EFFICIENCY is this value).
DECODE_EFFICIENCY = Efficiency(bandwidth=0.8, compute=0.6, step_overhead_s=2e-3, allreduce_latency_s=8e-6,
                               kv_bandwidth=0.8, seq_overhead_s=0.0)
ROLLOUT_RESERVE_BYTES = 4e9  # per rollout GPU: activations, CUDA graphs, sampler workspace -- assumption


def train_seconds(model: ModelShape, tokens: float, trainer_gpus: int, device: DeviceSpec, gpus_per_node: int,
                  cost: TrainingCost = TrainingCost(), updates: int = 1) -> float:
    """``updates`` optimizer updates over ``tokens`` tokens: each the slower of its compute (6 x params FLOPs per
    token at ``mfu``) and its FSDP traffic (``fsdp_comm_factor`` x the weights per micro-batch per GPU, over
    InfiniBand once the trainer spans nodes, NVLink within one)."""
    per_update = tokens / updates
    compute = cost.flops_per_param_token * model.params * per_update / (trainer_gpus * device.peak_flops * cost.mfu)
    if trainer_gpus <= 1:
        return updates * compute
    bw = cost.ib_bandwidth_per_gpu * cost.nccl_efficiency if trainer_gpus > gpus_per_node else device.nvlink_bandwidth
    micro = math.ceil(per_update / trainer_gpus / cost.micro_batch_tokens)
    comm = micro * cost.fsdp_comm_factor * model.weight_bytes * (trainer_gpus - 1) / trainer_gpus / bw
    return updates * max(compute, comm)


def min_trainer_gpus(params: float, hbm_bytes: float, cost: TrainingCost = TrainingCost(),
                     state_bytes_per_param: float | None = None) -> int:
    """GPUs whose memory holds the sharded training state within ``state_memory_fraction`` of HBM.
    ``state_bytes_per_param``: less than the default when FSDP offloads parameters or optimizer states."""
    per_param = cost.state_bytes_per_param if state_bytes_per_param is None else state_bytes_per_param
    return max(1, math.ceil(params * per_param / (hbm_bytes * cost.state_memory_fraction)))


@dataclass(frozen=True)
class Workload:
    """One training step of the recipe, as the cost model sees it."""

    sequences: int  # data.train_batch_size x rollout.n
    prompt_tokens: float  # mean per sequence
    response_tokens: float  # mean per sequence
    updates: int = 1  # mini-batch updates per step
    max_num_seqs: int = 1024  # a replica's concurrency cap (rollout.max_num_seqs)
    kv_memory_fraction: float = 0.5  # rollout.gpu_memory_utilization

    @property
    def tokens(self) -> float:
        return self.sequences * (self.prompt_tokens + self.response_tokens)


def rollout_seconds(model: ModelShape, device: DeviceSpec, tp: int, replicas: int, w: Workload,
                    eff: Efficiency = DECODE_EFFICIENCY) -> float:
    """Generation time of one step on ``replicas`` replicas of ``tp`` GPUs: each replica runs its share in waves of
    as many sequences as its KV cache and ``max_num_seqs`` admit; a wave prefills its prompts, then decodes with
    the context growing (``DecodeCost.span``, the simulator's integral)."""
    free = tp * (device.hbm_bytes * w.kv_memory_fraction - ROLLOUT_RESERVE_BYTES) - model.weight_bytes
    if free <= 0:
        raise SplitError(f"a rollout replica of TP={tp} cannot hold the {model.params / 1e9:.1f} B model's weights in "
                         f"{w.kv_memory_fraction:g} of {device.hbm_bytes / 1e9:.0f} GB per GPU",
                         "raise actor_rollout_ref.rollout.tensor_model_parallel_size or "
                         "actor_rollout_ref.rollout.gpu_memory_utilization")
    share = math.ceil(w.sequences / replicas)
    per_seq = w.prompt_tokens + w.response_tokens
    concurrent = max(1, min(share, w.max_num_seqs, int(free // model.kv_bytes_per_token // per_seq)))
    waves = math.ceil(share / concurrent)
    wave = prefill_time(model, device, concurrent * w.prompt_tokens, tp, eff) + \
        decode_cost(model, device, tp, eff).span(concurrent, concurrent * w.prompt_tokens, w.response_tokens)
    return waves * wave


class SplitError(ValueError):
    """No trainer/rollout split fits: ``reason`` says why, ``fix`` what to change."""

    def __init__(self, reason: str, fix: str) -> None:
        super().__init__(f"{reason}; {fix}")
        self.reason, self.fix = reason, fix


@dataclass(frozen=True)
class SplitRequest:
    nodes: int
    gpus_per_node: int
    replica_gpus: int  # tensor x data x pipeline parallel size of one rollout replica
    trainer_floor: int  # GPUs the training state needs (min_trainer_gpus)
    batch_divisors: tuple[int, ...] = ()  # the trainer's GPU count must divide each (verl's batch checks)
    trainer_multiple: int = 1  # the trainer's GPU count must be a multiple (Ulysses sequence parallel size)


@dataclass(frozen=True)
class Split:
    """A plan: ``trainer_nodes x trainer_gpus_per_node`` train, ``rollout_nodes x rollout_gpus_per_node`` generate."""

    trainer_nodes: int
    trainer_gpus_per_node: int
    rollout_nodes: int
    rollout_gpus_per_node: int
    replicas: int
    whole_nodes: bool
    train_s: float = 0.0  # estimated seconds per step
    rollout_s: float = 0.0
    tried: tuple[tuple[int, float], ...] = field(default=(), compare=False)  # (trainer GPUs, tokens/s)

    @property
    def trainer_gpus(self) -> int:
        return self.trainer_nodes * self.trainer_gpus_per_node

    @property
    def rollout_gpus(self) -> int:
        return self.rollout_nodes * self.rollout_gpus_per_node

    def overrides(self) -> list[str]:
        """The Hydra overrides that give this split explicitly (what a user sets to choose another)."""
        return ["actor_rollout_ref.hybrid_engine=False", f"trainer.nnodes={self.trainer_nodes}",
                f"trainer.n_gpus_per_node={self.trainer_gpus_per_node}",
                f"actor_rollout_ref.rollout.nnodes={self.rollout_nodes}",
                f"actor_rollout_ref.rollout.n_gpus_per_node={self.rollout_gpus_per_node}"]


def _trainer_fits(r: SplitRequest, gpus: int) -> bool:
    return gpus >= r.trainer_floor and gpus % r.trainer_multiple == 0 and \
        all(d % gpus == 0 for d in r.batch_divisors)


def candidates(r: SplitRequest) -> list[Split]:
    """Every split that fits ``r``: whole-node splits, or (when none fits) the same split on every node."""
    n, g, rep = r.nodes, r.gpus_per_node, r.replica_gpus
    out = []
    if g % rep == 0:
        out = [Split(a, g, n - a, g, (n - a) * g // rep, True) for a in range(1, n) if _trainer_fits(r, a * g)]
    if not out:
        out = [Split(n, k, n, g - k, n * ((g - k) // rep), False) for k in range(1, g)
               if (g - k) % rep == 0 and _trainer_fits(r, n * k)]
    return out


def _refusal(r: SplitRequest) -> SplitError:
    total, rep, g = r.nodes * r.gpus_per_node, r.replica_gpus, r.gpus_per_node
    keys = "trainer.nnodes x trainer.n_gpus_per_node"
    if total < 2:
        return SplitError(f"{total} GPU: Laminar needs at least one trainer GPU beside one rollout replica",
                          f"give the job 2 or more GPUs ({keys}), or drop +laminar=enabled to run verl's colocated "
                          "trainer")
    if rep > g or g % rep and r.nodes > 1:
        return SplitError(f"a rollout replica of {rep} GPUs (tensor x data x pipeline parallel) does not fit whole on "
                          f"a node of {g} GPUs", "lower actor_rollout_ref.rollout.tensor_model_parallel_size to a "
                          f"divisor of {g}")
    if r.nodes == 1 and g - rep < 1:
        return SplitError(f"TP={rep} takes all {g} GPUs of the one node for one replica and leaves no trainer GPU",
                          "lower actor_rollout_ref.rollout.tensor_model_parallel_size, or add nodes (trainer.nnodes)")
    need = r.trainer_floor + rep
    if need > total:
        return SplitError(f"the trainer needs {r.trainer_floor} GPUs for the model's training state and one rollout "
                          f"replica {rep} more: {need} > the {total} GPUs of {r.nodes} node(s) x {g}",
                          "add nodes (trainer.nnodes), turn on FSDP offload (actor_rollout_ref.actor.fsdp_config."
                          "optimizer_offload=True), or lower tensor_model_parallel_size")
    return SplitError(f"no trainer size between {r.trainer_floor} and {total - rep} GPUs on {r.nodes} node(s) x {g} "
                      f"passes verl's batch checks (the trainer's GPU count must divide {list(r.batch_divisors)} and "
                      f"be a multiple of {r.trainer_multiple})", "choose data.train_batch_size / ppo_mini_batch_size "
                      "with more divisors, or set the split yourself (actor_rollout_ref.hybrid_engine=False with "
                      "trainer.* and actor_rollout_ref.rollout.nnodes / n_gpus_per_node)")


def check_devices(nodes: int, gpus_per_node: int, replica_gpus: int) -> None:
    """Refuse the splits no model could fit (too few GPUs, a replica wider than a node or than one node's spare
    GPUs) before anything is known of the model."""
    r = SplitRequest(nodes, gpus_per_node, replica_gpus, trainer_floor=1)
    if not candidates(r):
        raise _refusal(r)


def plan_split(r: SplitRequest, model: ModelShape, device: DeviceSpec, tp: int, w: Workload,
               cost: TrainingCost = TrainingCost()) -> Split:
    """The candidate with the highest estimated pipeline throughput; ties go to more rollout GPUs (generation's
    long tail is what an asynchronous trainer hides)."""
    found = candidates(r)
    if not found:
        raise _refusal(r)
    scored = []
    for s in found:
        t_train = train_seconds(model, w.tokens, s.trainer_gpus, device, r.gpus_per_node, cost, w.updates)
        t_roll = rollout_seconds(model, device, tp, s.replicas, w)
        scored.append((w.tokens / max(t_train, t_roll), s.rollout_gpus, s, t_train, t_roll))
    rate, _, best, t_train, t_roll = max(scored, key=lambda x: (round(x[0], 6), x[1]))
    tried = tuple((s.trainer_gpus, round(v, 1)) for v, _, s, _, _ in scored)
    return Split(best.trainer_nodes, best.trainer_gpus_per_node, best.rollout_nodes, best.rollout_gpus_per_node,
                 best.replicas, best.whole_nodes, t_train, t_roll, tried)
