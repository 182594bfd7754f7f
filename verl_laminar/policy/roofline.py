"""Roofline cost of one decode step, and the batch size B where decoding turns compute-bound.

Pure: no ray/torch/vllm/verl. The repack planner reads ``B`` from here (Laminar, Step 3: "B, the
largest decode batch whose step time stays close to that of a small batch, from a roofline model of
the GPU"), and the cluster simulator prices every decode step with the same function, so the two
cannot drift apart.

A decode step of ``n`` sequences holding ``C`` tokens of context in total, on a rollout of ``tp``
GPUs, reads every weight once plus every cached key/value once, and does ~2 FLOPs per weight per
sequence plus the attention over the cache:

    mem(C)      = W / (tp * bw * weight_eff) + C * kv_bytes_per_token / (tp * bw * kv_eff)
    flops(n, C) = (2 * P_matmul * n + 4 * layers * heads * head_dim * C) / tp
    step(n, C)  = fixed + n * per_seq + max(mem(C), flops / (tp * peak * flop_eff))

Weight reads (large GEMVs) and cache reads (paged attention over scattered blocks) reach different
fractions of peak bandwidth, hence two efficiencies; the engine's per-step work outside the kernels
(scheduling, sampling) has a fixed part and a part per sequence. Every term is linear in C, which
lets the simulator integrate step times exactly while the context grows (see ``DecodeCost``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator: dense bf16 peak, HBM size and bandwidth, and its links."""

    name: str
    peak_flops: float  # dense bf16 FLOP/s (no sparsity)
    hbm_bandwidth: float  # bytes/s
    hbm_bytes: float
    nvlink_bandwidth: float  # bytes/s, per GPU, one direction
    pcie_bandwidth: float  # bytes/s host<->device, one direction, per GPU

    def __post_init__(self) -> None:
        for key in ("peak_flops", "hbm_bandwidth", "hbm_bytes", "nvlink_bandwidth", "pcie_bandwidth"):
            if getattr(self, key) <= 0:
                raise ValueError(f"DeviceSpec {self.name!r}: {key} must be > 0, got {getattr(self, key)!r}")


# Datasheet numbers. bf16 dense peak is the sparsity-free figure (NVIDIA quotes 1,979 TFLOP/s "with
# sparsity" for the SXM H100/H800, i.e. 989.5 dense). H800 differs from H100 SXM only in its NVLink
# (400 GB/s total vs 900 GB/s) -- NVIDIA H800 / H100 / H200 product briefs. PCIe Gen5 x16 is 64 GB/s
# per direction on paper.
H800 = DeviceSpec("H800", peak_flops=989.5e12, hbm_bandwidth=3.35e12, hbm_bytes=80e9,
                  nvlink_bandwidth=200e9, pcie_bandwidth=64e9)
H100 = DeviceSpec("H100", peak_flops=989.5e12, hbm_bandwidth=3.35e12, hbm_bytes=80e9,
                  nvlink_bandwidth=450e9, pcie_bandwidth=64e9)
# H200 SXM: same compute as H100, 141 GB HBM3e at 4.8 TB/s (NVIDIA H200 product brief).
H200 = DeviceSpec("H200", peak_flops=989.5e12, hbm_bandwidth=4.8e12, hbm_bytes=141e9,
                  nvlink_bandwidth=450e9, pcie_bandwidth=64e9)
DEVICES: dict[str, DeviceSpec] = {d.name: d for d in (H800, H100, H200)}


@dataclass(frozen=True)
class ModelShape:
    """The parts of a decoder-only transformer's config that set its decode cost."""

    name: str
    params: float  # total parameter count
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    dtype_bytes: int = 2  # bf16 weights and KV cache

    def __post_init__(self) -> None:
        if self.params <= 0 or min(self.layers, self.hidden, self.heads, self.kv_heads, self.head_dim) <= 0:
            raise ValueError(f"ModelShape {self.name!r}: sizes must be positive")
        if self.params <= self.vocab * self.hidden:
            raise ValueError(f"ModelShape {self.name!r}: params={self.params} is smaller than the embedding")

    @property
    def matmul_params(self) -> float:
        """Weights touched by matmuls each step: the input embedding is a row lookup, not a matmul."""
        return self.params - self.vocab * self.hidden

    @property
    def weight_bytes(self) -> float:
        """Bytes of the whole checkpoint (what a weight update moves)."""
        return self.params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """Key + value for every layer and KV head (grouped-query attention shares heads)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


@dataclass(frozen=True)
class Efficiency:
    """Fractions of peak that real kernels reach, and the per-step costs outside the roofline."""

    bandwidth: float = 0.8  # weight GEMVs reach ~70-85% of peak HBM bandwidth
    compute: float = 0.6  # small-M GEMMs in decode reach ~50-70% of peak FLOP/s
    step_overhead_s: float = 1.5e-3  # scheduler, sampling and launch time per step outside the kernels
    allreduce_latency_s: float = 8e-6  # one small tensor-parallel all-reduce over NVLink
    kv_bandwidth: float = 0.8  # paged attention over the cache (scattered blocks) may reach less
    seq_overhead_s: float = 0.0  # per-sequence engine work each step (scheduling, sampling)

    def __post_init__(self) -> None:
        for key in ("bandwidth", "compute", "kv_bandwidth"):
            if not 0 < getattr(self, key) <= 1:
                raise ValueError(f"efficiency {key}={getattr(self, key)!r} must be in (0, 1]")
        if min(self.step_overhead_s, self.allreduce_latency_s, self.seq_overhead_s) < 0:
            raise ValueError("step_overhead_s, seq_overhead_s and allreduce_latency_s must be >= 0")


DEFAULT_EFFICIENCY = Efficiency()
# The datasheet roofline (no efficiency losses): the paper takes B "from a roofline model of the GPU".
DATASHEET = Efficiency(bandwidth=1.0, compute=1.0, step_overhead_s=0.0, allreduce_latency_s=0.0, kv_bandwidth=1.0)


@dataclass(frozen=True)
class DecodeCost:
    """Step time ``fixed + per_seq*n + max(mem0 + mem1*C, flop_per_seq*n + flop1*C)`` seconds."""

    fixed: float
    mem0: float
    mem1: float
    flop_per_seq: float
    flop1: float
    per_seq: float = 0.0

    def step(self, n: int, ctx_tokens: float) -> float:
        """Seconds for one decode step of ``n`` sequences holding ``ctx_tokens`` tokens of context."""
        return self.fixed + self.per_seq * n + max(self.mem0 + self.mem1 * ctx_tokens,
                                                   self.flop_per_seq * n + self.flop1 * ctx_tokens)

    def span(self, n: int, ctx_tokens: float, steps: float) -> float:
        """Seconds for ``steps`` decode steps while each of the ``n`` sequences grows by one token per step.

        Exact integral of the piecewise-linear step time (context rises by ``n`` per step), so events
        can jump from one sequence finishing to the next instead of walking token by token.
        """
        if steps <= 0 or n <= 0:
            return 0.0
        c0, c1 = ctx_tokens, ctx_tokens + n * steps
        # both branches are linear in C: a(C) = a0 + a1*C (memory), b(C) = b0 + b1*C (compute)
        a0, a1, b0, b1 = self.mem0, self.mem1, self.flop_per_seq * n, self.flop1
        area = _area_of_max(a0, a1, b0, b1, c0, c1)
        return (self.fixed + self.per_seq * n) * steps + area / n

    def steps_within(self, n: int, ctx_tokens: float, seconds: float) -> float:
        """Inverse of ``span``: decode steps completed in ``seconds`` (Newton on a convex, increasing span)."""
        if seconds <= 0 or n <= 0:
            return 0.0
        guess = seconds / self.step(n, ctx_tokens)  # an upper bound: later steps are never faster
        for _ in range(30):
            err = self.span(n, ctx_tokens, guess) - seconds
            if abs(err) <= 1e-9 * max(1.0, seconds):
                break
            guess -= err / self.step(n, ctx_tokens + n * guess)
            guess = max(guess, 0.0)
        return guess


def _area_of_max(a0: float, a1: float, b0: float, b1: float, c0: float, c1: float) -> float:
    """Integral over C in [c0, c1] of max(a0 + a1*C, b0 + b1*C) (hot path: no helper calls)."""
    if a1 != b1:
        cross = (b0 - a0) / (a1 - b1)
        if c0 < cross < c1:
            sq0, sqx, sq1 = c0 * c0, cross * cross, c1 * c1
            if a0 + a1 * c0 >= b0 + b1 * c0:  # memory-bound first, compute-bound after the crossing
                return a0 * (cross - c0) + 0.5 * a1 * (sqx - sq0) + b0 * (c1 - cross) + 0.5 * b1 * (sq1 - sqx)
            return b0 * (cross - c0) + 0.5 * b1 * (sqx - sq0) + a0 * (c1 - cross) + 0.5 * a1 * (sq1 - sqx)
    mid = 0.5 * (c0 + c1)
    if a0 + a1 * mid >= b0 + b1 * mid:
        return a0 * (c1 - c0) + 0.5 * a1 * (c1 * c1 - c0 * c0)
    return b0 * (c1 - c0) + 0.5 * b1 * (c1 * c1 - c0 * c0)


def decode_cost(model: ModelShape, device: DeviceSpec, tp: int = 1, eff: Efficiency = DEFAULT_EFFICIENCY) -> DecodeCost:
    """The roofline coefficients of a ``tp``-GPU rollout of ``model`` on ``device``."""
    if tp < 1:
        raise ValueError(f"tp={tp} must be >= 1")
    bw = device.hbm_bandwidth * tp
    peak = device.peak_flops * eff.compute * tp
    # two all-reduces per layer (after attention and after the MLP) when the layer is split
    comm = 2 * model.layers * eff.allreduce_latency_s if tp > 1 else 0.0
    return DecodeCost(
        fixed=eff.step_overhead_s + comm,
        mem0=model.matmul_params * model.dtype_bytes / (bw * eff.bandwidth),
        mem1=model.kv_bytes_per_token / (bw * eff.kv_bandwidth),
        flop_per_seq=2.0 * model.matmul_params / peak,
        flop1=4.0 * model.layers * model.heads * model.head_dim / peak,
        per_seq=eff.seq_overhead_s,
    )


def decode_step_time(model: ModelShape, device: DeviceSpec, batch: int, ctx_tokens: float, tp: int = 1,
                     eff: Efficiency = DEFAULT_EFFICIENCY) -> float:
    """Seconds per decode step: ``max(bytes(weights + KV) / bandwidth, FLOPs / peak)`` plus overheads."""
    if batch < 0 or ctx_tokens < 0:
        raise ValueError(f"batch={batch} and ctx_tokens={ctx_tokens} must be >= 0")
    return decode_cost(model, device, tp, eff).step(batch, ctx_tokens)


def prefill_time(model: ModelShape, device: DeviceSpec, tokens: float, tp: int = 1,
                 eff: Efficiency = DEFAULT_EFFICIENCY) -> float:
    """Seconds to prefill ``tokens`` prompt tokens in one pass: compute-bound above a few hundred tokens."""
    if tokens <= 0:
        return 0.0
    flops = 2.0 * model.matmul_params * tokens / tp
    bytes_read = model.matmul_params * model.dtype_bytes / tp
    return max(flops / (device.peak_flops * eff.compute), bytes_read / (device.hbm_bandwidth * eff.bandwidth))


def compute_bound_batch(model: ModelShape, device: DeviceSpec, tp: int = 1, ctx_per_seq: float = 0.0,
                        eff: Efficiency = DATASHEET, cap: int = 4096) -> int:
    """Smallest batch B at which a decode step's FLOP time reaches its memory time (``cap`` if never).

    With ``ctx_per_seq = 0`` this is the textbook arithmetic-intensity ridge, ``peak * dtype_bytes /
    (2 * bandwidth)``, independent of the model's size. A long context per sequence adds cache reads
    faster than attention FLOPs (grouped-query attention), which pushes B up or removes the ridge.
    """
    if ctx_per_seq < 0:
        raise ValueError(f"ctx_per_seq={ctx_per_seq} must be >= 0")
    cost = decode_cost(model, device, tp, eff)
    # where the FLOP branch of the max overtakes the memory branch
    per_seq = cost.flop_per_seq + (cost.flop1 - cost.mem1) * ctx_per_seq
    if per_seq <= 0:
        return cap
    return max(1, min(cap, math.ceil(cost.mem0 / per_seq)))


def batch_from_profile(step_s: dict[int, float], tolerance: float = 0.25) -> int:
    """B from a measured decode profile: the largest batch whose time per decode step stays within
    ``1 + tolerance`` of the single-sequence step (``step_s``: batch size -> seconds per decode step).

    This is the measured counterpart of ``compute_bound_batch``: below B, adding sequences is nearly free.
    """
    if not step_s or 1 not in step_s:
        raise ValueError(f"the profile needs batch size 1 as its reference; got batch sizes {sorted(step_s)}")
    if tolerance < 0:
        raise ValueError(f"tolerance={tolerance} must be >= 0")
    limit = step_s[1] * (1.0 + tolerance)
    best = 1
    for b in sorted(step_s):
        if step_s[b] > limit:
            break  # the first batch over the limit ends the flat region
        best = b
    return best


def crossover_batch_from_profile(step_s: dict[int, float]) -> int:
    """B from a measured decode profile as the roofline defines it: where the compute term catches up.

    A decode step costs about ``max(t_mem, s * b)`` (plus overheads): ``t_mem`` is what one sequence pays
    (weights and runtime overhead, ~ ``step_s[1]``), ``s`` the per-sequence cost once compute-bound,
    measured as the slope between the two largest profiled batches. B is the largest profiled batch with
    ``s * b <= t_mem``: up to there a merged batch costs about what a lone tail sequence does per step.
    Unlike ``batch_from_profile`` it does not require a flat region, which vLLM-CPU does not have (every
    added sequence costs something there, but far less than a step of its own).
    """
    if not step_s or 1 not in step_s:
        raise ValueError(f"the profile needs batch size 1 as its reference; got batch sizes {sorted(step_s)}")
    sizes = sorted(step_s)
    if len(sizes) < 3:
        raise ValueError(f"need at least 3 batch sizes (1 and two large ones) to find the slope; got {sizes}")
    b1, b2 = sizes[-2], sizes[-1]
    slope = (step_s[b2] - step_s[b1]) / (b2 - b1)
    if slope <= 0:
        return b2  # still flat at the largest batch profiled: B is at least that
    best = 1
    for b in sizes:
        if slope * b <= step_s[1]:
            best = b
    return best
