"""One call for the trainer: migrate legacy keys, type-check ``laminar.*``, and check it against the rest of verl's config.

The ``laminar:`` block alone cannot catch settings that only go wrong together with verl's keys (a GRPO group split
across weight versions, a correction mode whose verl switches are off, a checkpoint engine that bypasses the relays),
so those cross-checks live here and run once at start-up, before any Ray actor is spawned.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from verl_laminar.config import platform_defaults
from verl_laminar.config.legacy_reward import check_legacy_reward_keys
from verl_laminar.config.schema import LaminarConfig, LaminarConfigError

logger = logging.getLogger(__name__)

RELAY_BACKEND = "laminar"
RELAY_BACKEND_MODULE = "verl_laminar.relay.verl_backend"
_CKPT = "actor_rollout_ref.rollout.checkpoint_engine"
_ROLLOUT = "actor_rollout_ref.rollout"
_CORR = "algorithm.rollout_correction"


def _get(cfg: DictConfig, key: str, default: Any = None) -> Any:
    return OmegaConf.select(cfg, key, default=default)


def resolve_replicas(cfg: DictConfig, lam: LaminarConfig) -> int:
    """``laminar.replicas``, or (null) the number of vLLM replicas the standalone rollout resources hold."""
    if lam.replicas is not None:
        return lam.replicas
    nnodes, per_node = _get(cfg, f"{_ROLLOUT}.nnodes", 0) or 0, _get(cfg, f"{_ROLLOUT}.n_gpus_per_node", 0) or 0
    # verl's RolloutReplica spans tp * dp * pp devices
    per_replica = 1
    for key in ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size"):
        per_replica *= _get(cfg, f"{_ROLLOUT}.{key}", 1) or 1
    replicas = nnodes * per_node // per_replica
    if replicas < 1:
        raise LaminarConfigError(
            f"laminar.replicas=None: cannot derive the replica count from {_ROLLOUT}.nnodes={nnodes} x "
            f"n_gpus_per_node={per_node} devices at {per_replica} per replica; set laminar.replicas=N "
            f"or give the rollouts their own devices ({_ROLLOUT}.nnodes >= 1)"
        )
    return replicas


def check_checkpoint_engine(cfg: DictConfig) -> None:
    backend = _get(cfg, f"{_CKPT}.backend")
    if backend != RELAY_BACKEND:
        raise LaminarConfigError(
            f"{_CKPT}.backend={backend!r}: Laminar publishes weights through its relays; set "
            f"{_CKPT}.backend={RELAY_BACKEND} and {_CKPT}.custom_backend_module={RELAY_BACKEND_MODULE} "
            "(as +laminar=enabled does)"
        )


def check_dispatch(cfg: DictConfig, lam: LaminarConfig) -> None:
    n = _get(cfg, f"{_ROLLOUT}.n", 1)
    if not lam.dispatch.group_size_from_rollout_n and n > 1:
        raise LaminarConfigError(
            f"laminar.dispatch.group_size_from_rollout_n=False with {_ROLLOUT}.n={n}: a GRPO group's {n} responses "
            "would be split across replicas and weight versions; set it to true"
        )


def check_off_policy(cfg: DictConfig, lam: LaminarConfig) -> None:
    """The correction mode and verl's ``algorithm.rollout_correction`` switches must agree."""
    key = "laminar.off_policy.correction"
    mode = lam.off_policy.correction
    if not _get(cfg, f"{_ROLLOUT}.calculate_log_probs", True):
        raise LaminarConfigError(
            f"{_ROLLOUT}.calculate_log_probs=False with {key}={mode!r}: every correction needs the generating "
            f"policy's log-probs; set {_ROLLOUT}.calculate_log_probs=true"
        )
    is_level, rs_level = _get(cfg, f"{_CORR}.rollout_is"), _get(cfg, f"{_CORR}.rollout_rs")
    bypass, loss_type = _get(cfg, f"{_CORR}.bypass_mode", False), _get(cfg, f"{_CORR}.loss_type")
    if mode == "clipped_token_ratio":
        # verl's bypass mode with the PPO clip loss: old_log_prob := the rollout's log-probs, so the clipped ratio is
        # taken against the policy that generated each token, however stale it is.
        if not bypass or loss_type != "ppo_clip":
            raise LaminarConfigError(
                f"{key}={mode!r} needs {_CORR}.bypass_mode=true and {_CORR}.loss_type=ppo_clip "
                f"(got bypass_mode={bypass!r}, loss_type={loss_type!r}); +laminar=enabled sets both, "
                f"or use {key}=verl_rollout_correction for verl's other modes"
            )
        if is_level is not None or rs_level is not None:
            raise LaminarConfigError(
                f"{key}={mode!r} with {_CORR}.rollout_is={is_level!r} / rollout_rs={rs_level!r}: importance "
                f"weights or rejection sampling are verl's correction; set {key}=verl_rollout_correction to use them"
            )
    elif not bypass and is_level is None and rs_level is None:
        raise LaminarConfigError(
            f"{key}={mode!r} but {_CORR} enables nothing (rollout_is, rollout_rs null, bypass_mode false): stale "
            f"samples would go uncorrected; set e.g. {_CORR}.rollout_is=token, or {key}=clipped_token_ratio"
        )


def validate_and_migrate(cfg: DictConfig, on_cpu: Optional[bool] = None) -> LaminarConfig:
    """Start-up check for a ``+laminar=enabled`` run; mutates ``cfg`` only to migrate legacy reward keys and to
    fill in the platform defaults (``platform_defaults``; ``on_cpu`` None: this process's platform decides).

    Returns the typed ``laminar`` block with ``replicas`` resolved to an integer.
    """
    check_legacy_reward_keys(cfg)
    node = cfg.get("laminar")
    if node is None:
        raise LaminarConfigError("laminar=None: the config has no laminar block; add +laminar=enabled to the command")
    lam = LaminarConfig.from_omegaconf(node)
    if on_cpu is None:
        from verl_laminar.platform.cpu import cpu_platform_requested  # torch and verl: only when a run starts

        on_cpu = cpu_platform_requested()
    lam = platform_defaults.resolve(lam, on_cpu, cfg)
    check_checkpoint_engine(cfg)
    check_dispatch(cfg, lam)
    check_off_policy(cfg, lam)
    lam = dataclasses.replace(lam, replicas=resolve_replicas(cfg, lam))
    logger.info("laminar config: %s", lam)
    return lam
