"""Every number the simulator uses, with where it comes from.

"paper" is Sheng et al., Laminar (arXiv 2510.12633); "assumption" marks a value with no published
source, each of which the sensitivity sweep (``sim.sensitivity``) varies. "CALIBRATED from the paper" marks a
value chosen so that the simulator reproduces one of the paper's own measurements (listed in
``CALIBRATED_FROM_PAPER``): the simulator agreeing with the paper on that measurement is then no evidence, and a
test that only re-checks it tests the arithmetic, not the model. All systems read the same
``SimParams``: there is no per-system knob, so a difference between systems can only come from their
schedules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from verl_laminar.policy.roofline import DEVICES, H800, DeviceSpec, Efficiency, ModelShape
from verl_laminar.policy.split import DECODE_EFFICIENCY as SPLIT_DECODE_EFFICIENCY

# Qwen2.5 config.json on the Hugging Face hub (hidden_size, num_hidden_layers, num_attention_heads,
# num_key_value_heads, vocab_size; head_dim = hidden / heads = 128) and the model cards' parameter counts.
QWEN25_7B = ModelShape("7b", params=7.62e9, layers=28, hidden=3584, heads=28, kv_heads=4, head_dim=128, vocab=152064)
QWEN25_32B = ModelShape("32b", params=32.8e9, layers=64, hidden=5120, heads=40, kv_heads=8, head_dim=128, vocab=152064)
QWEN25_72B = ModelShape("72b", params=72.7e9, layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, vocab=152064)
MODELS: dict[str, ModelShape] = {m.name: m for m in (QWEN25_7B, QWEN25_32B, QWEN25_72B)}

# GPUs per rollout (tensor parallel). 32B: paper, Step 3 ("16 rollouts of 4 GPUs"). 7B fits one 80 GB
# GPU with room for its KV cache; 72B (145 GB of weights) is given a whole 8-GPU machine -- assumption.
ROLLOUT_TP: dict[str, int] = {"7b": 1, "32b": 4, "72b": 8}

# Device defaults (peak FLOP/s, HBM, NVLink, PCIe) live in policy/roofline.py with their sources;
# the simulator re-exports them here so this file lists every input.
DEVICE_DEFAULTS: dict[str, DeviceSpec] = DEVICES


@dataclass(frozen=True)
class Network:
    gpus_per_machine: int = 8  # paper: "machines of 8 H800"
    # 8 x 400 Gb/s ConnectX-7 per 8-GPU machine (DGX/HGX H100-class reference design): 50 GB/s per GPU
    ib_bandwidth_per_gpu: float = 50e9
    nccl_efficiency: float = 0.8  # nccl-tests bus bandwidth over 400G InfiniBand reaches ~40 of 50 GB/s
    nccl_hop_latency_s: float = 20e-6  # inter-node NCCL message latency, tens of microseconds -- assumption
    # CALIBRATED from the paper: 72B (145 GB) reaches 127 relays in < 1.6 s, so W*Tb <= ~1.5 s
    # and host-to-host RDMA moves >= ~95 GB/s per machine; 100 GB/s used.
    relay_bandwidth: float = 100e9
    relay_msg_latency_s: float = 10e-6  # paper: start-up "microseconds over RDMA per message"
    # Trainer -> master relay hand-off. CALIBRATED from the paper: the trainer stalls 0.64 s (32B, 65.6 GB)
    # and 1.40 s (72B, 145 GB) per update, i.e. 102-104 GB/s; 100 GB/s used.
    publish_bandwidth: float = 100e9
    pcie_efficiency: float = 0.8  # pinned host->device copies reach ~80% of PCIe Gen5 x16's 64 GB/s
    weight_load_fixed_s: float = 0.3  # engine-side cost of swapping a weight set in (RPCs, cache reset) -- assumption
    # GPU-to-GPU weight sync outside the transfer itself: gathering FSDP shards into the rollout layout
    # bucket by bucket and the collective's set-up -- assumption (swept).
    g2g_fixed_s: float = 0.5
    # Optional, off by default: GPU-to-GPU sync as AReaL and verl actually wire it. Trainer rank 0
    # gathers each full tensor (FSDP full_tensor()) and broadcasts it over one NCCL group made of
    # itself and every rollout GPU, so each rollout GPU receives all W bytes and keeps its shard --
    # AReaL: FSDP engine ``_update_weights_from_distributed`` (dist.broadcast(src=0) over
    # ``weight_update_group``) and remote engine ``init_weights_update_group`` (world size = generation
    # world size + 1); verl 0.9.1: ``checkpoint_engine/nccl_checkpoint_engine.py`` (one sender, actor
    # rank 0, plus the rollout workers). Off, each of a rollout's tp GPUs receives only its W/tp shard
    # on its own NIC (a resharding broadcast neither system implements). It applies to every system
    # that syncs GPU to GPU (one-step, streaming, AReaL, Laminar without relays); tp = 1 (7B) is
    # unchanged. Swept as ``g2g_full_weights_rank0``; docs/simulator.md gives its effect.
    g2g_full_weights: bool = False


# Decode efficiency -- one setting for every system. Weight GEMVs and cache reads reach ~80% of HBM
# bandwidth and an engine spends ~2 ms per step outside its kernels, so a 7B model decodes one
# sequence in ~7.5 ms/token on an H800 and, as the paper's Step 1 premise has it, a batch of 8
# costs nearly as much per step as a batch of 64 (32B, 4 GPUs, 2K context: 0.77x). Slower cache
# reads or per-sequence engine work would lengthen the longest trajectory toward the paper's
# measured 828 s but break that premise; docs/simulator.md shows both settings.
# CALIBRATED from the paper: bandwidth, kv_bandwidth and step_overhead_s were chosen so that the paper's
# Step 1 premise above holds (a small decode batch costs nearly as much per step as a large one), not
# measured with a kernel benchmark.
DECODE_EFFICIENCY = SPLIT_DECODE_EFFICIENCY  # policy.split prices the runtime's split with the same value


@dataclass(frozen=True)
class Inference:
    efficiency: Efficiency = DECODE_EFFICIENCY  # HBM/FLOP efficiencies and step overheads (roofline.py)
    kv_memory_fraction: float = 0.8  # vLLM gpu_memory_utilization (vLLM default 0.9, verl colocated 0.5) -- assumption
    reserve_bytes_per_gpu: float = 4e9  # activations, CUDA graphs, sampler workspace -- assumption
    max_num_seqs: int = 1024  # verl's rollout default (rollout.max_num_seqs)
    c_max: float = 0.99  # paper, Step 3; also vLLM admits new requests only below a ~1% free-block watermark
    # Simulation granularity, not hardware: trajectories of one rollout finishing within this many
    # decode steps of each other are retired in one event (each at most this many steps late).
    event_quantum_tokens: float = 32.0
    # Likewise, tool answers are delivered on a grid of this many seconds (each at most that late).
    tool_return_quantum_s: float = 0.5


@dataclass(frozen=True)
class Training:
    mfu: float = 0.35  # dense-model training reaches ~40-47% MFU on H100 (Megatron-LM); variable-length RL batches less -- assumption
    flops_per_param_token: float = 6.0  # forward + backward, Kaplan et al. 2020
    state_bytes_per_param: float = 16.0  # bf16 weights/grads + fp32 master/Adam m/v (ZeRO, Rajbhandari et al. 2020)
    state_memory_fraction: float = 0.5  # at most half of HBM for states, the rest for 16K-token activations -- assumption
    # FSDP (verl's default trainer) shards the states over all trainer GPUs: each micro-batch
    # all-gathers the weights for the forward and again for the backward and reduce-scatters the
    # gradients, ~3x the weights per GPU whatever the GPU count (ZeRO-3 volume, Rajbhandari et al.
    # 2020), overlapped with compute. Micro-batches hold up to 16K tokens per GPU (verl's
    # ppo_max_token_len_per_gpu default), so once a mini-batch gives each GPU less than that the
    # traffic no longer shrinks with more GPUs: the trainer's strong-scaling limit.
    fsdp_comm_factor: float = 3.0
    micro_batch_tokens: int = 16384
    colocate_switch_fixed_s: float = 1.0  # verl colocated: vLLM sleep/wake and cache re-allocation per switch -- assumption


@dataclass(frozen=True)
class Task:
    name: str
    prompt_median: float
    prompt_sigma: float
    prompt_max: int
    response_median: float
    response_sigma: float
    response_max: int
    tool_calls_max: int = 0
    tool_call_prob: float = 0.0  # calls per trajectory ~ Binomial(tool_calls_max, tool_call_prob)
    tool_latency_median_s: float = 0.0
    tool_latency_sigma: float = 0.0
    tool_latency_max_s: float = 0.0
    tool_output_median: float = 0.0
    tool_output_sigma: float = 0.0
    tool_output_max: int = 0
    # Measured lengths (``sim.lengths.Empirical``, from ``--lengths FILE`` / ``--prompt-lengths FILE``): when
    # set, the workload resamples them instead of drawing that quantity from the log-normal above (whose
    # median and sigma are then unused; the cap is the measured maximum). None: the log-normal.
    response_lengths: Optional["Empirical"] = None  # noqa: F821 - defined in sim.lengths, which imports this module
    prompt_lengths: Optional["Empirical"] = None  # noqa: F821


# Response lengths: log-normal with p99 = 10x the median (CALIBRATED from the paper, Context: "the 99th
# percentile can be ten times the median"), so sigma = ln(10) / z_0.99. Capped at 16K (paper: "responses of up
# to 16K"). ``--lengths MEDIAN,P99`` (sim.lengths) replaces both.
P99_OVER_MEDIAN_SIGMA = math.log(10.0) / 2.3263478740408408
# CALIBRATED from the paper: the median is chosen so that synchronous verl spends ~83% of a step generating
# on the reference cell (32B, 128 GPUs), as DAPO's runs did (paper, Context: "up to 83.1%"); see
# docs/simulator.md (item 6: the simulated share is 68% there, so the calibration is approximate).
RESPONSE_MEDIAN = 1400.0

MATH = Task(
    "math",
    prompt_median=256, prompt_sigma=0.5, prompt_max=2048,  # DAPO-Math prompts: short, "up to 2K" (paper) -- median an assumption
    response_median=RESPONSE_MEDIAN, response_sigma=P99_OVER_MEDIAN_SIGMA, response_max=16384,
)
# Multi-turn code execution: "up to 8 tool calls" (paper). The call rate, the sandbox latency and the
# size of tool outputs are assumptions (swept); generated tokens follow the math distribution.
TOOL = Task(
    "tool",
    prompt_median=768, prompt_sigma=0.4, prompt_max=4096,  # system prompt with the tool schema -- assumption
    response_median=RESPONSE_MEDIAN, response_sigma=P99_OVER_MEDIAN_SIGMA, response_max=16384,
    tool_calls_max=8, tool_call_prob=0.35,
    tool_latency_median_s=1.0, tool_latency_sigma=0.75, tool_latency_max_s=30.0,
    tool_output_median=128, tool_output_sigma=0.8, tool_output_max=2048,
)
TASKS: dict[str, Task] = {"math": MATH, "tool": TOOL}


@dataclass(frozen=True)
class Schedule:
    prompts_per_step: int = 512  # paper: 512 prompts x 16 responses per step
    group_size: int = 16
    minibatches: int = 16  # paper: 16 mini-batch updates per step (streaming trains them as data arrives)
    repack_interval_s: float = 5.0  # paper, Step 3
    # CALIBRATED from the paper: Step 3 measures "0.69 s per repack"; source and target both pause that long.
    repack_pause_s: float = 0.69
    # Asynchronous systems (Laminar, AReaL): generation pauses while the experience buffer already
    # holds this many steps of finished groups the trainer has not taken (backpressure); the same
    # rule for both -- assumption (swept).
    async_buffer_steps: float = 1.0
    # Laminar's laminar.dispatch.groups_per_batch: prompt groups one rollout takes per batch (one weight version);
    # None is the product's default, ceil(prompts_per_step / rollouts)
    groups_per_batch: Optional[int] = None
    sync_steps: int = 3  # steps simulated; every step of a synchronous system is alike
    pipeline_steps: int = 5  # one-step-stale / streaming: publications simulated; the first is warm-up
    pipeline_warmup: int = 1
    async_steps: int = 6  # Laminar / AReaL: publications simulated; the first few fill the pipeline
    async_warmup: int = 2


@dataclass(frozen=True)
class SimParams:
    device: DeviceSpec = H800  # paper: H800 cluster
    network: Network = field(default_factory=Network)
    inference: Inference = field(default_factory=Inference)
    training: Training = field(default_factory=Training)
    schedule: Schedule = field(default_factory=Schedule)
    tasks: tuple[Task, ...] = (MATH, TOOL)  # a tuple keeps SimParams hashable (results are memoized by it)
    # A measured CPU machine (``sim.cpu.CpuProfile``) instead of the roofline GPU: every rollout, the
    # trainer and the weight path then cost what this machine's micro benchmarks measured, and all of
    # them share its cores. None: the GPU cluster above.
    cpu: Optional["CpuProfile"] = None  # noqa: F821 - defined in sim.cpu, which imports this module

    def task(self, name: str) -> Task:
        for t in self.tasks:
            if t.name == name:
                return t
        raise ValueError(f"unknown task {name!r}; choose one of {[t.name for t in self.tasks]}")


DEFAULT_PARAMS = SimParams()

# Every input above marked "CALIBRATED from the paper", by its dotted path in ``SimParams`` ("tasks.<field>":
# that field of every task). A result that depends mostly on one of these reproduces the paper by construction.
CALIBRATED_FROM_PAPER: tuple[str, ...] = (
    "network.relay_bandwidth",  # the 1.6 s broadcast of 72B to 127 relays
    "network.publish_bandwidth",  # the 0.64 s / 1.40 s trainer stalls (32B / 72B)
    "tasks.response_median",  # RESPONSE_MEDIAN: synchronous verl's ~83% generation share
    "tasks.response_sigma",  # P99_OVER_MEDIAN_SIGMA: "the 99th percentile can be ten times the median"
    "schedule.repack_pause_s",  # the measured 0.69 s per repack
    "inference.efficiency.bandwidth",  # DECODE_EFFICIENCY: the Step 1 batch-8 vs batch-64 premise
    "inference.efficiency.kv_bandwidth",
    "inference.efficiency.step_overhead_s",
)
