"""``+laminar=enabled`` on a colocated recipe: split its GPUs into trainer and rollout devices.

A recipe with ``actor_rollout_ref.hybrid_engine=True`` (verl's default) gives ``trainer.nnodes x
trainer.n_gpus_per_node`` GPUs to one colocated worker group. Laminar's rollouts are standalone replicas, so the
split is planned here from the recipe (``policy.split``: the cost model the simulator uses), logged with why and the
keys that override it, and written as verl's standalone keys (``hybrid_engine=False``, ``trainer.*``,
``actor_rollout_ref.rollout.nnodes / n_gpus_per_node``). A split the user gave wins: ``hybrid_engine=False`` is
left as it is, and rollout devices named beside ``hybrid_engine=True`` are taken as the split.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Optional

from omegaconf import DictConfig, OmegaConf, open_dict

from verl_laminar.policy.roofline import DEVICES, DeviceSpec, ModelShape
from verl_laminar.policy.split import (
    Split,
    SplitError,
    SplitRequest,
    Workload,
    check_devices,
    min_trainer_gpus,
    plan_split,
)

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("LAMINAR_LOGGING_LEVEL", "INFO"))  # the split is part of the run's record

HYBRID_KEY = "actor_rollout_ref.hybrid_engine"
ROLLOUT = "actor_rollout_ref.rollout"
ACTOR = "actor_rollout_ref.actor"
OVERRIDE_HINT = ("to choose another split, set actor_rollout_ref.hybrid_engine=False with trainer.nnodes, "
                 "trainer.n_gpus_per_node, actor_rollout_ref.rollout.nnodes and actor_rollout_ref.rollout."
                 "n_gpus_per_node")
# Mean prompt and response lengths as fractions of the recipe's caps: the split only needs the balance of training
# and generation, in which the lengths mostly cancel -- assumption.
LENGTH_FRACTION = 0.5


@dataclass(frozen=True)
class SplitPlan:
    split: Split
    gpus: int
    tp: int
    trainer_floor: int
    device: str
    model: str  # where the model's shape came from

    def why(self) -> str:
        s = self.split
        rate = " ".join(f"{g}:{v / 1e3:.1f}k" for g, v in s.tried)
        layout = "whole nodes" if s.whole_nodes else "within the node" if s.trainer_nodes == 1 else \
            "the same split on every node"
        return (f"trainer {s.trainer_nodes} node(s) x {s.trainer_gpus_per_node} GPUs, rollouts {s.rollout_nodes} "
                f"node(s) x {s.rollout_gpus_per_node} GPUs ({s.replicas} replicas of {self.tp} GPUs; {layout}) of "
                f"the recipe's {self.gpus} colocated GPUs: the highest estimated throughput of the candidates "
                f"(trainer GPUs:tokens/s {rate}; at this split ~{s.train_s:.0f} s training vs ~{s.rollout_s:.0f} s "
                f"generation per step on {self.device}); the trainer needs >= {self.trainer_floor} GPUs for the "
                f"training state (model from {self.model})")


def rollout_device() -> tuple[DeviceSpec, str]:
    """The GPU this process sees, from the roofline table (H100 when none is visible or it is not in the table),
    and a note saying which."""
    name = ""
    try:
        import torch

        if torch.cuda.is_available():
            name = torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001 - no device visible to the driver: fall back below
        pass
    spec = next((d for key, d in DEVICES.items() if key in name), DEVICES["H100"])
    if name and spec.name in name:
        return spec, spec.name
    seen = f"GPU {name} is not in the roofline table {sorted(DEVICES)}" if name else "no GPU visible here"
    return spec, f"{spec.name} (assumed: {seen})"


def _get(cfg: DictConfig, key: str, default=None):
    return OmegaConf.select(cfg, key, default=default)


def _state_bytes_per_param(cfg: DictConfig) -> float:
    """verl's FSDP actor: fp32 params and grads (4 + 4 B) unless param_offload, Adam m and v (8 B) unless
    optimizer_offload; a reference model (KL loss or KL in reward) adds bf16 weights (2 B) unless offloaded."""
    fsdp = f"{ACTOR}.fsdp_config"
    out = (0.0 if _get(cfg, f"{fsdp}.param_offload", False) else 8.0) + \
        (0.0 if _get(cfg, f"{fsdp}.optimizer_offload", False) else 8.0)
    ref = bool(_get(cfg, f"{ACTOR}.use_kl_loss", False)) or bool(_get(cfg, "algorithm.use_kl_in_reward", False))
    if ref and not _get(cfg, "actor_rollout_ref.ref.fsdp_config.param_offload", False):
        out += 2.0
    return out


def _request(cfg: DictConfig, model: ModelShape, device: DeviceSpec, replica: int) -> SplitRequest:
    n = int(_get(cfg, f"{ROLLOUT}.n", 1))
    sp = int(_get(cfg, f"{ACTOR}.ulysses_sequence_parallel_size", 1) or 1)
    # verl's train step asserts mini_batch x n % data-parallel size == 0 (dp = trainer GPUs / sp), and without
    # dynamic batch sizes validate_config asserts train_batch_size x n % trainer GPUs == 0
    divisors = [int(_get(cfg, f"{ACTOR}.ppo_mini_batch_size")) * n * sp]
    if not _get(cfg, f"{ACTOR}.use_dynamic_bsz", False):
        divisors.append(int(cfg.data.train_batch_size) * n)
    floor = min_trainer_gpus(model.params, device.hbm_bytes, state_bytes_per_param=_state_bytes_per_param(cfg))
    r = SplitRequest(nodes=int(cfg.trainer.nnodes), gpus_per_node=int(cfg.trainer.n_gpus_per_node),
                     replica_gpus=replica, trainer_floor=floor, batch_divisors=tuple(divisors), trainer_multiple=sp)
    return r


def _workload(cfg: DictConfig) -> Workload:
    batch, mini = int(cfg.data.train_batch_size), int(_get(cfg, f"{ACTOR}.ppo_mini_batch_size"))
    return Workload(sequences=batch * int(_get(cfg, f"{ROLLOUT}.n", 1)),
                    prompt_tokens=LENGTH_FRACTION * int(cfg.data.max_prompt_length),
                    response_tokens=LENGTH_FRACTION * int(cfg.data.max_response_length),
                    updates=max(1, batch // mini) if mini > 0 else 1,
                    max_num_seqs=int(_get(cfg, f"{ROLLOUT}.max_num_seqs", 1024) or 1024),
                    kv_memory_fraction=float(_get(cfg, f"{ROLLOUT}.gpu_memory_utilization", 0.5)))


def user_split(cfg: DictConfig) -> bool:
    """Whether the config names the rollout devices itself (the user's split, left as given)."""
    return not bool(_get(cfg, HYBRID_KEY, True)) or int(_get(cfg, f"{ROLLOUT}.nnodes", 0) or 0) > 0


def plan_for(cfg: DictConfig, device: Optional[tuple[DeviceSpec, str]] = None) -> Optional[SplitPlan]:
    """The split of a colocated recipe's GPUs; None when the config names its rollout devices itself. Raises
    ``SplitError`` (reason and fix) when no split fits."""
    from verl_laminar.models.sizes import ModelSizeError, model_shape

    if user_split(cfg):
        return None
    tp = int(_get(cfg, f"{ROLLOUT}.tensor_model_parallel_size", 1) or 1)
    replica = tp * int(_get(cfg, f"{ROLLOUT}.data_parallel_size", 1) or 1) * \
        int(_get(cfg, f"{ROLLOUT}.pipeline_model_parallel_size", 1) or 1)
    check_devices(int(cfg.trainer.nnodes), int(cfg.trainer.n_gpus_per_node), replica)  # before the model is read
    spec, device_note = device or rollout_device()
    path = str(_get(cfg, "actor_rollout_ref.model.path", ""))
    try:
        source, model = model_shape(path)
    except (ModelSizeError, OSError, KeyError, ValueError) as e:
        raise SplitError(f"actor_rollout_ref.hybrid_engine=True and the model's shape is unknown ({e})",
                         OVERRIDE_HINT) from e
    r = _request(cfg, model, spec, replica)
    split = plan_split(r, model, spec, tp, _workload(cfg))
    return SplitPlan(split, r.nodes * r.gpus_per_node, tp, r.trainer_floor, device_note, source)


def apply_split(cfg: DictConfig, device: Optional[tuple[DeviceSpec, str]] = None) -> Optional[SplitPlan]:
    """Plan the split (``plan_for``) and write verl's standalone keys; logs the split, why, and the keys to override
    it. A config that names its rollout devices is only made standalone (``hybrid_engine=False``)."""
    if user_split(cfg):
        if bool(_get(cfg, HYBRID_KEY, True)):
            logger.info("laminar: %s=True with %s.nnodes set: the rollouts run standalone on the devices given "
                        "(%s.nnodes x n_gpus_per_node)", HYBRID_KEY, ROLLOUT, ROLLOUT)
            with open_dict(cfg):
                OmegaConf.update(cfg, HYBRID_KEY, False, force_add=True)
        return None
    try:
        plan = plan_for(cfg, device)
    except SplitError as e:
        raise SplitError(f"{HYBRID_KEY}=True under +laminar=enabled: no trainer/rollout split of the "
                         f"{int(cfg.trainer.nnodes)} x {int(cfg.trainer.n_gpus_per_node)} GPUs fits: {e.reason}",
                         e.fix) from e
    write_split(cfg, plan)
    logger.info("laminar: %s=True (colocated recipe): split into %s; %s: %s", HYBRID_KEY, plan.why(),
                OVERRIDE_HINT, " ".join(plan.split.overrides()))
    return plan


def write_split(cfg: DictConfig, plan: SplitPlan) -> None:
    """verl's standalone keys for ``plan``."""
    s = plan.split
    with open_dict(cfg):
        for key, value in ((HYBRID_KEY, False), ("trainer.nnodes", s.trainer_nodes),
                           ("trainer.n_gpus_per_node", s.trainer_gpus_per_node), (f"{ROLLOUT}.nnodes", s.rollout_nodes),
                           (f"{ROLLOUT}.n_gpus_per_node", s.rollout_gpus_per_node)):
            OmegaConf.update(cfg, key, value, force_add=True)
