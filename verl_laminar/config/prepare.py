"""The Laminar trainer's settings from verl's config: the keys ``+laminar=enabled`` needs filled in, the derived
publication interval, groups per replica batch, the warm-up check, verl's off-policy threshold, and repack's B.

Pure config work (no Ray, no model), so each piece is tested on a composed config.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any, Callable, Optional

from omegaconf import DictConfig, OmegaConf, open_dict

from verl_laminar.config.split import apply_split, rollout_device

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("LAMINAR_LOGGING_LEVEL", "INFO"))  # start-up decisions belong in the run's record

AGENT_LOOP_MANAGER = "verl_laminar.rollout.agent_loop.LaminarAgentLoopManager"
SYNC_STEP_KEY = "trainer.v1.laminar.parameter_sync_step"
WARMUP_KEY = "trainer.v1.laminar.num_warmup_batches"
GROUPS_PER_BATCH_KEY = "laminar.dispatch.groups_per_batch"

# Runtime keys +laminar=enabled should carry; filled here (and logged) when a config lacks them, so the
# trainer runs on any composition that selected trainer_mode=laminar.
RUNTIME_DEFAULTS: dict[str, Any] = {
    "actor_rollout_ref.rollout.agent.agent_loop_manager_class": AGENT_LOOP_MANAGER,
    WARMUP_KEY: 2,
}
CHECKPOINT_ENGINE_KEY = "actor_rollout_ref.rollout.checkpoint_engine"


def derive_parameter_sync_step(config: DictConfig) -> int:
    """Mini-batch updates between two publications: ``train_batch_size / ppo_mini_batch_size``.

    The paper's step is 16 mini-batch updates on 512 prompts, then one publication. verl's separate_async base
    samples ``train_batch_size / parameter_sync_step`` prompts per update and asserts
    ``train_batch_size == parameter_sync_step * ppo_mini_batch_size``, so the value follows from the batch; a
    recipe only sets it to say the same thing twice, and a contradicting value is an error here, not an assert
    deep in verl's constructor.
    """
    batch = int(config.data.train_batch_size)
    mini = int(config.actor_rollout_ref.actor.ppo_mini_batch_size)
    if mini < 1 or batch % mini:
        raise ValueError(
            f"data.train_batch_size={batch} is not a multiple of actor_rollout_ref.actor.ppo_mini_batch_size={mini}: "
            "Laminar publishes weights after train_batch_size / ppo_mini_batch_size mini-batch updates; choose a "
            "train_batch_size that is a multiple of ppo_mini_batch_size")
    derived = batch // mini
    given = OmegaConf.select(config, SYNC_STEP_KEY, default=None)
    if given is not None and int(given) != derived:
        raise ValueError(
            f"{SYNC_STEP_KEY}={given}, but data.train_batch_size / actor_rollout_ref.actor.ppo_mini_batch_size = "
            f"{batch} / {mini} = {derived} mini-batch updates per publication; remove {SYNC_STEP_KEY} (it is "
            f"derived from the batch) or set it to {derived}")
    return derived


def prepare_config(config: DictConfig) -> Any:
    """Validate the laminar block and align verl's keys with it; returns the typed ``LaminarConfig``."""
    from verl_laminar.config import validate_and_migrate
    from verl_laminar.data.validate import check_data_files

    # Laminar's rollouts are standalone replicas that never pause for training: a colocated recipe's GPUs are
    # split into trainer and rollout devices (config.split; a split the user gave wins) before the replica count
    # is derived from the rollout devices
    apply_split(config)
    lam = validate_and_migrate(config)
    check_data_files(config)
    with open_dict(config):
        for key, value in RUNTIME_DEFAULTS.items():
            if OmegaConf.select(config, key, default=None) is None:
                logger.info("laminar: %s not set; using %r", key, value)
                OmegaConf.update(config, key, value, force_add=True)
        manager = OmegaConf.select(config, "actor_rollout_ref.rollout.agent.agent_loop_manager_class")
        if manager != AGENT_LOOP_MANAGER:
            raise ValueError(f"actor_rollout_ref.rollout.agent.agent_loop_manager_class={manager!r}: Laminar needs "
                             f"{AGENT_LOOP_MANAGER} (it pins every request of a group to one replica and version)")
        sync_step = derive_parameter_sync_step(config)
        if OmegaConf.select(config, SYNC_STEP_KEY, default=None) is None:
            logger.info("laminar: %s = train_batch_size / ppo_mini_batch_size = %d (mini-batch updates per "
                        "publication)", SYNC_STEP_KEY, sync_step)
        OmegaConf.update(config, SYNC_STEP_KEY, sync_step, force_add=True)
        # the relay stores and sends each version in the rollout's dtype (verl's FSDP actor keeps fp32 masters:
        # twice the bytes on every node and every hop); the engine casts floating-point tensors to it
        dtype_key = f"{CHECKPOINT_ENGINE_KEY}.engine_kwargs.laminar.dtype"
        if OmegaConf.select(config, dtype_key, default=None) is None:
            OmegaConf.update(config, dtype_key, str(OmegaConf.select(config, "actor_rollout_ref.rollout.dtype",
                                                                     default="bfloat16")), force_add=True)
        # verl's separate_async base reads its own keys; one source of truth: trainer.v1.laminar
        for key in ("parameter_sync_step", "num_warmup_batches"):
            value = OmegaConf.select(config, f"trainer.v1.laminar.{key}")
            OmegaConf.update(config, f"trainer.v1.separate_async.{key}", value, force_add=True)
        check_off_policy_threshold(config, lam.buffer.max_staleness)
        # verl's bound counts steps since submission and drops; Laminar bounds n - j itself (policy.bound)
        OmegaConf.update(config, OFF_POLICY_KEY, None, force_add=True)
    return lam


OFF_POLICY_KEY = "trainer.v1.sampler.max_off_policy_threshold"
VERL_OFF_POLICY_DEFAULT = 8  # verl's trainer/config/ppo_trainer.yaml (a contract test pins it)


def check_off_policy_threshold(config: DictConfig, max_staleness: Optional[int]) -> None:
    """verl's staleness bound drops a trajectory once ``global_steps - submitted + 1 > threshold``; under Laminar
    the bound is ``laminar.buffer.max_staleness`` (admission and the trainer's choice: nothing finished is dropped).
    verl's default passes with a log line; any other value a user set stops the run, naming the Laminar key."""
    value = OmegaConf.select(config, OFF_POLICY_KEY, default=None)
    if value is None or int(value) == VERL_OFF_POLICY_DEFAULT:
        logger.info("laminar: %s (%s) is not used; the lag at training (s - 1) - j is %s by "
                    "laminar.buffer.max_staleness",
                    OFF_POLICY_KEY, value, "unbounded" if max_staleness is None else f"bounded to {max_staleness}")
        return
    raise ValueError(f"{OFF_POLICY_KEY}={value}: under +laminar=enabled the staleness bound is "
                     f"laminar.buffer.max_staleness (set laminar.buffer.max_staleness={max(int(value) - 1, 0)} for "
                     f"about the same bound, without dropping finished trajectories) and remove {OFF_POLICY_KEY}")


def groups_per_batch(config: DictConfig, replicas: int) -> int:
    """A replica's share of one training step unless set: ceil(train_batch_size / replicas)."""
    value: Optional[int] = OmegaConf.select(config, GROUPS_PER_BATCH_KEY, default=None)
    if value is None:
        value = math.ceil(int(config.data.train_batch_size) / replicas)
    if int(value) < 1:
        raise ValueError(f"{GROUPS_PER_BATCH_KEY}={value}: must be >= 1")
    return int(value)


def check_warmup(config: DictConfig, replicas: int, gpb: int) -> None:
    """Enough prompts outstanding that no replica idles while its batch has room (design §8)."""
    need = math.ceil(replicas * gpb / int(config.data.train_batch_size)) + 1
    have = OmegaConf.select(config, WARMUP_KEY)
    if have < need:
        logger.warning("%s=%s < %d: replicas may idle for lack of prompts (%d replicas x %d groups per batch)",
                       WARMUP_KEY, have, need, replicas, gpb)


def default_max_batch(measure_cpu: Optional[Callable[[], int]] = None) -> int:
    """B for the rollout hardware when laminar.repack.max_batch_b is null: on the CPU platform what
    ``measure_cpu`` measures on a replica (``rollout.decode_profile``), on a GPU the roofline ridge of the device."""
    from verl_laminar.platform.cpu import cpu_platform_requested

    if cpu_platform_requested():
        if measure_cpu is None:
            raise ValueError("laminar.repack.max_batch_b is null on the CPU platform and no replica is there to "
                             "measure B on; set laminar.repack.max_batch_b")
        return measure_cpu()
    spec, note = rollout_device()
    if note != spec.name:
        logger.warning("laminar.repack: rollout GPU %s; B from its datasheet (set laminar.repack.max_batch_b to "
                       "override)", note)
    # the arithmetic-intensity ridge of a bf16 decode step (policy.roofline.compute_bound_batch, no context)
    return max(1, int(spec.peak_flops * 2 / (2 * spec.hbm_bandwidth)))


def repack_settings(laminar: Any, measure_cpu: Optional[Callable[[], int]] = None) -> Optional[Any]:
    """The router's repack settings from the typed laminar config; None when laminar.repack.enabled=false.
    ``measure_cpu``: B measured on a replica, used on the CPU platform when laminar.repack.max_batch_b is null."""
    from verl_laminar.policy.repack import RepackPolicy
    from verl_laminar.rollout.router import RepackSettings

    r = laminar.repack
    if not r.enabled:
        return None
    return RepackSettings(RepackPolicy(c_max=r.c_max, max_batch=r.max_batch_b or default_max_batch(measure_cpu)),
                          r.interval_s)
