"""Cost models derived from ``params``: rollout capacity, training, weight movement.

Every system prices the same operation with the same function here; the broadcast times come from
``policy.chain`` (the code the relays run), so the simulated chain is the planned chain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from verl_laminar.policy import chain, split
from verl_laminar.policy.roofline import DecodeCost, ModelShape, compute_bound_batch, decode_cost, prefill_time
from verl_laminar.policy.split import TrainingCost
from verl_laminar.sim.params import SimParams


@dataclass(frozen=True)
class RolloutCosts:
    """What a ``tp``-GPU rollout of a model costs to run."""

    decode: DecodeCost
    prefill_s_per_token: float  # compute-bound prefill, seconds per prompt token (the weight matmuls)
    kv_capacity: int  # tokens
    max_seqs: int
    c_max: float
    repack_batch: int  # B from the roofline
    # Attention of a prefill, seconds per (new token x context position): see ``prefill_seconds``.
    prefill_attn_s: float = 0.0

    def prefill_seconds(self, new: float, ctx_after: float) -> float:
        """Compute-bound prefill of ``new`` tokens that bring a sequence's context to ``ctx_after``.

        The matmuls cost 2 x matmul params FLOPs per token (``prefill_s_per_token``). Each new token
        at position j also attends to the j positions before it: QK^T and AV are 4 x head_dim FLOPs
        per head, layer and position, the same 4 * layers * heads * head_dim per cached token that a
        decode step pays. Summed over positions ctx_after - new + 1 .. ctx_after that is
        ``2 * layers * heads * head_dim * new * (2 * ctx_after - new)`` FLOPs (``prefill_attn_s`` is
        its coefficient over the rollout's effective peak). A short prompt hardly notices the term;
        re-prefilling a 16K-token context pays ~23% (7B) more than the matmuls alone, so a system
        that rebuilds long in-flight caches pays for their length squared, as the GPU does.
        """
        if new <= 0:
            return 0.0
        return self.prefill_s_per_token * new + self.prefill_attn_s * new * (2.0 * ctx_after - new)


def rollout_costs(model: ModelShape, tp: int, p: SimParams) -> RolloutCosts:
    inf, dev = p.inference, p.device
    free = tp * (dev.hbm_bytes * inf.kv_memory_fraction - inf.reserve_bytes_per_gpu) - model.weight_bytes
    if free <= 0:
        raise ValueError(f"{model.name} does not fit a rollout of tp={tp} on {dev.name}: raise tp")
    per_token = prefill_time(model, dev, 1e6, tp, inf.efficiency) / 1e6
    # causal attention over the prefix: 2 * layers * heads * head_dim FLOPs per (token, position) pair
    attn = 2.0 * model.layers * model.heads * model.head_dim / (tp * dev.peak_flops * inf.efficiency.compute)
    return RolloutCosts(
        decode=decode_cost(model, dev, tp, inf.efficiency),
        prefill_s_per_token=per_token,
        kv_capacity=int(free // model.kv_bytes_per_token),
        max_seqs=inf.max_num_seqs,
        c_max=inf.c_max,
        repack_batch=compute_bound_batch(model, dev, tp),  # datasheet ridge, as the paper
        prefill_attn_s=attn,
    )


def training_cost(p: SimParams) -> TrainingCost:
    """The simulator's training and network numbers as the split policy's ``TrainingCost`` (one cost model)."""
    t, net = p.training, p.network
    return TrainingCost(mfu=t.mfu, flops_per_param_token=t.flops_per_param_token,
                        state_bytes_per_param=t.state_bytes_per_param, state_memory_fraction=t.state_memory_fraction,
                        fsdp_comm_factor=t.fsdp_comm_factor, micro_batch_tokens=t.micro_batch_tokens,
                        ib_bandwidth_per_gpu=net.ib_bandwidth_per_gpu, nccl_efficiency=net.nccl_efficiency)


def train_seconds(model: ModelShape, tokens: float, trainer_gpus: int, p: SimParams, updates: int = 1) -> float:
    """``updates`` optimizer updates over ``tokens`` tokens in all (``policy.split.train_seconds``: the slower of
    compute and FSDP traffic per update), the function the runtime's trainer/rollout split uses."""
    return split.train_seconds(model, tokens, trainer_gpus, p.device, p.network.gpus_per_machine, training_cost(p),
                               updates)


def min_trainer_gpus(model: ModelShape, p: SimParams) -> int:
    """Whole machines whose memory holds the sharded training state within the allowed fraction."""
    n = p.network.gpus_per_machine
    return n * math.ceil(split.min_trainer_gpus(model.params, p.device.hbm_bytes, training_cost(p)) / n)


def publish_stall(model: ModelShape, p: SimParams) -> float:
    """Trainer pause while it hands its weights to the master relay over RDMA (then it resumes)."""
    return model.weight_bytes / p.network.publish_bandwidth


def relay_plan(machines: int, model: ModelShape, p: SimParams) -> chain.ChainPlan:
    """The relay chain over ``machines`` rollout machines, planned by the runtime's own code."""
    net = p.network
    return chain.plan_chain([f"m{i:05d}" for i in range(machines)], W=model.weight_bytes,
                            Tb=1.0 / net.relay_bandwidth, Ts=net.relay_msg_latency_s)


def relay_arrivals(plan: chain.ChainPlan, model: ModelShape, p: SimParams) -> list[float]:
    """Seconds after the master holds the weights until relay k (chain order) holds all of them.

    Chunk i reaches relay k after (k + i) chunk times, so the last chunk arrives at (k + c - 1); at
    the tail (k = p - 1) this is ``chain_time(p, c)``.
    """
    net = p.network
    c, n = plan.chunks, len(plan.relays)
    per_chunk = model.weight_bytes / net.relay_bandwidth / c + net.relay_msg_latency_s
    return [0.0] + [(k + c - 1) * per_chunk for k in range(1, n)]


def pcie_load(model: ModelShape, tp: int, p: SimParams) -> float:
    """A rollout loads its shard from the machine-local relay; each GPU has its own PCIe link."""
    net = p.network
    return model.weight_bytes / tp / (p.device.pcie_bandwidth * net.pcie_efficiency) + net.weight_load_fixed_s


def g2g_broadcast(model: ModelShape, tp: int, receivers: int, p: SimParams) -> float:
    """GPU-to-GPU weight sync from the trainer to ``receivers`` rollouts at once (NCCL).

    NCCL's broadcast is a pipelined chain like the relays', so ``t_star`` prices it, with each of the
    ``tp`` shards on its own GPU's NIC; plus the gather and set-up outside the transfer. With
    ``network.g2g_full_weights`` (AReaL's and verl's wiring, off by default) trainer rank 0 sends the
    full weights down one chain through every rollout GPU: W bytes per hop, receivers x tp + 1 members.
    """
    if receivers <= 0:
        return 0.0
    net = p.network
    bw = net.ib_bandwidth_per_gpu * net.nccl_efficiency
    if net.g2g_full_weights:
        move = chain.t_star(receivers * tp + 1, model.weight_bytes, 1.0 / bw, net.nccl_hop_latency_s)
    else:
        move = chain.t_star(receivers + 1, model.weight_bytes / tp, 1.0 / bw, net.nccl_hop_latency_s)
    return move + net.g2g_fixed_s


def colocate_switch(model: ModelShape, tp: int, p: SimParams) -> float:
    """verl colocated: each mode switch moves the rollout weights across PCIe and re-creates caches."""
    return model.weight_bytes / tp / (p.device.pcie_bandwidth * p.network.pcie_efficiency) + \
        p.training.colocate_switch_fixed_s
