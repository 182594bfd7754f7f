"""Patch ``relay_in_place_refresh``: a relay refresh loads each tensor-parallel rank's shard in place.

Why. verl's refresh of a vLLM replica (``ServerAdapter.update_weights``, one per rollout rank) pushes every tensor
of the version through each rank's weight bucket, and vLLM's loaders narrow a full tensor to the rank's shard only
after that copy: every rank of a TP replica copies the whole version (at 72B with TP=8, 8 x 145 GB per node per
refresh). The relay already holds the version in host memory on the machine, so the workers can read it there.

What changes, only for the relay checkpoint engine (``wire.RELAY_WIRE``) and plain weights:
    every rank's ``update_weights``: the ranks without the replica's server return at once (nothing to send)
    the server rank: ``RelayVersion.locate()`` (the relay committed it; or the machine's pulled copy when the
    relay died) -> ``collective_rpc("laminar_refresh", root, version)`` -> every vLLM worker of the replica
    opens the version with ``StoreReader`` (shared lock, identity check) and loads it through vLLM's in-place
    reload, whose loaders narrow the zero-copy views before they copy: a rank reads its shard plus the
    replicated tensors (``relay/vllm_ext.py``, counted at the copies) -> every worker must report the version
    asked for -> the server's KV cache is cleared and its ``global_steps`` set, as verl's own refresh does.
A quantized, LoRA or MTP-drafter rollout, and a replica wider than a machine or with data-parallel shards, keeps
verl's bucket path (``in_place_blocker``; decided from the config, the same on every rank), and the worker refuses
a load it cannot do in place rather than loading part of it. verl's server (``vLLMHttpServer.collective_rpc``)
drops the workers' answers; the patch makes it return them.
verl's worker extension gets the relay's worker methods (``RelayWorkerExtension``); ``LAMINAR_FAULT_WEIGHT_LOAD``
counts these loads like the bucket ones. Applied with the CPU patches only, like every patch that changes a GPU
run's refresh, until it has run on a GPU (``docs/gpu.md``).
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any, Optional, Sequence

from verl_laminar.patches import Patch

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("LAMINAR_LOGGING_LEVEL", "INFO"))  # each refresh's line is part of the run's record

TARGET_MODULE = "verl.workers.rollout.vllm_rollout.vllm_rollout"
EXTENSION_MODULE = "verl.workers.rollout.vllm_rollout.utils"
SERVER_MODULE = "verl.workers.rollout.vllm_rollout.vllm_async_server"
# also replaced: vLLMColocateWorkerExtension (new methods) and vLLMHttpServer.collective_rpc (returns the answers)
TARGET = f"{TARGET_MODULE}.ServerAdapter.update_weights"
WORKER_METHOD = "laminar_refresh"
IN_PLACE_LOG = "laminar refresh:"  # starts the line each in-place refresh logs (tests and the report read it)
# the relay's worker methods verl's extension class gets (``RelayWorkerExtension``)
_RELAY_METHODS = ("laminar_refresh", "laminar_load_from_relay", "laminar_served_version", "laminar_read_bytes",
                  "_laminar_load")


class InPlaceLoadError(RuntimeError):
    """A replica's workers did not all load the version asked for (the message names replica, version, ranks)."""


def in_place_blocker(config: Any, model_config: Any, local_world: Optional[int] = None) -> Optional[str]:
    """Why this rollout must load through verl's buckets, or None: in place. ``local_world``: rollout ranks per
    machine (``RAY_LOCAL_WORLD_SIZE``); a replica wider than a machine would hand its other machines' workers
    this machine's store, and verl's ``collective_rpc`` reaches one data-parallel shard only."""
    dp = int(getattr(config, "data_parallel_size", 1) or 1)
    world = int(getattr(config, "tensor_model_parallel_size", 1) or 1) * dp * int(
        getattr(config, "pipeline_model_parallel_size", 1) or 1)
    if local_world is not None and world > local_world:
        return f"a replica of {world} ranks spans machines of {local_world}"
    if dp > 1:
        return f"rollout.data_parallel_size={dp}"
    if getattr(config, "quantization", None):
        return f"rollout.quantization={config.quantization}"
    if getattr(getattr(config, "mtp", None), "enable", False) or getattr(getattr(model_config, "mtp", None),
                                                                         "enable", False):
        return "an MTP drafter (verl syncs it from the same buckets)"
    lora = getattr(model_config, "lora", None)
    rank = getattr(model_config, "lora_rank", 0) or (lora.get("rank", 0) if hasattr(lora, "get") else 0)
    if rank:
        return f"LoRA (rank {rank})"
    if getattr(getattr(config, "disaggregation", None), "enabled", False):
        return "prefill/decode disaggregation"
    if getattr(getattr(model_config, "hf_config", None), "quantization_config", None) is not None:
        return "a quantized checkpoint"
    return None


def check_loaded(results: Sequence[dict], version: int, replica: Any) -> list[int]:
    """Bytes each rank read, in rank order; raises ``InPlaceLoadError`` unless every worker now serves ``version``."""
    served = [r.get("version") for r in results]
    if not results or any(v != version for v in served):
        raise InPlaceLoadError(f"rollout replica {replica}: asked to load weight version {version} in place, its "
                               f"vLLM workers report {served}")
    return [int(r.get("read_bytes") or 0) for r in results]


def worker_refresh(worker: Any, root: str, version: int) -> dict:
    """``laminar_refresh`` on verl's worker extension: refuses what the in-place load cannot do, then loads."""
    from verl_laminar.patches.vllm_reload import (
        _LOADS,
        WeightLoadError,
        error_origin,
        maybe_inject_fault,
        plain_weights,
    )
    from verl_laminar.relay.vllm_ext import RelayWorkerExtension

    _LOADS[0] += 1
    rank = getattr(worker, "rank", "?")
    try:
        maybe_inject_fault()
        if not plain_weights(worker, None, False) or worker._use_mtp_drafter_weight_sync():
            raise InPlaceLoadError(
                "this model's weights cannot be loaded in place (quantized or with an MTP drafter); the rollout "
                "config should have kept verl's bucket path (patches/relay_refresh.py, in_place_blocker)")
        return RelayWorkerExtension.laminar_refresh(worker, root, version)
    except Exception as exc:
        # vLLM's collective_rpc passes on only the message of a worker's error: name its type and origin in it
        raise WeightLoadError(f"vLLM worker rank {rank}: loading weight version {version} in place from {root} "
                              f"failed: {error_origin(exc)}") from exc


def verl_split(worker: Any, weights: Any) -> tuple[list, Any]:
    """What verl's receiver does around ``model.load_weights`` for plain weights: patch the fused-MoE loaders, and
    copy names that are the model's buffers in place (``apply_buffer_updates``) instead of loading them."""
    from verl.utils.vllm.patch import patch_vllm_moe_model_weight_loader
    from verl.workers.rollout.vllm_rollout.weight_update_utils import split_buffer_updates

    model = worker.model_runner.model
    patch_vllm_moe_model_weight_loader(model)
    params, buffers, named = split_buffer_updates(model, list(weights))
    return params, (lambda: worker._apply_buffer_updates_all_models(buffers, named)) if buffers else (lambda: None)


def _extend_worker(module: Any) -> None:
    from verl_laminar.relay.vllm_ext import RelayWorkerExtension

    cls = module.vLLMColocateWorkerExtension
    if getattr(cls, WORKER_METHOD, None) is not None:
        return
    for name in _RELAY_METHODS:
        setattr(cls, name, RelayWorkerExtension.__dict__[name])
    setattr(cls, WORKER_METHOD, worker_refresh)
    cls._laminar_split = verl_split


def load_timeout_s(root: str, version: int) -> float:
    """How long the workers' load may take before the refresh fails instead of hanging: the fail-fast guard's
    silence bound (``LAMINAR_WEIGHT_SYNC_ACK_TIMEOUT_S``) plus the version read at 256 MiB/s, a floor far below
    what a host copies (a stuck worker must not hold a refresh forever; Laminar's router has its own deadline)."""
    from verl_laminar.patches.weight_sync_guard import ack_timeout_s
    from verl_laminar.relay.store import StoreReader

    return ack_timeout_s() + StoreReader(root).manifest(version).total_bytes / float(256 << 20)


async def refresh_in_place(adapter: Any, located: tuple[str, int], global_steps: Optional[int]) -> list[int]:
    """The server rank's refresh: every worker loads ``located`` in place; the server then drops its KV cache."""
    root, version = located
    results = await adapter._execute_method(WORKER_METHOD, timeout=load_timeout_s(root, int(version)),
                                            kwargs={"root": root, "version": int(version)})
    if results is None:
        raise InPlaceLoadError(f"rollout replica {adapter.replica_rank}: the server returned no answers from its "
                               f"workers for the in-place load of version {version} (verl's vLLMHttpServer."
                               "collective_rpc without this patch's change: was the server started where it applies?)")
    results = list(results)
    read = check_loaded(results, int(version), adapter.replica_rank)
    await adapter.server_handle.clear_kv_cache.remote()
    if global_steps is not None:
        await adapter.server_handle.set_global_steps.remote(global_steps)
    logger.info("%s replica %s loaded weight version %d in place; bytes read per rank %s of %s", IN_PLACE_LOG,
                adapter.replica_rank, version, read, results[0].get("total_bytes"))
    return read


def _wrap_adapter(module: Any) -> None:
    from verl_laminar.relay.wire import NAMED_TENSORS, RELAY_WIRE, enable_in_place

    cls = module.ServerAdapter
    update = cls.update_weights
    if getattr(update, "_laminar_in_place", False):
        return

    @functools.wraps(update)
    async def update_weights(self, weights, global_steps: int = None, wire_format: str = NAMED_TENSORS, **kwargs):
        if wire_format != RELAY_WIRE:
            return await update(self, weights, global_steps, wire_format=wire_format, **kwargs)
        local = os.environ.get("RAY_LOCAL_WORLD_SIZE")
        blocker = "LoRA" if kwargs.get("peft_config") else in_place_blocker(
            self.config, self.model_config, int(local) if local else None)
        if blocker is not None:
            if not getattr(self, "_laminar_blocker_logged", False):
                self._laminar_blocker_logged = True
                logger.warning("rollout replica %s refreshes through verl's weight buckets (every rank copies the "
                               "whole version): %s", self.replica_rank, blocker)
            return await update(self, weights, global_steps, wire_format=NAMED_TENSORS, **kwargs)
        if not self._ensure_server_handle():
            return None  # the server rank loads every worker of the replica
        await refresh_in_place(self, weights.locate(), global_steps)
        return None

    update_weights._laminar_in_place = True
    cls.update_weights = update_weights
    enable_in_place()


def _return_rpc_results(module: Any) -> None:
    """verl's server awaits the engine's ``collective_rpc`` and drops what the workers returned; the refresh needs
    it (each worker's version and bytes read), so the server's method returns it (nothing else changes)."""
    cls = module.vLLMHttpServer
    if getattr(cls.collective_rpc, "_laminar_returns", False):
        return

    async def collective_rpc(self, method, timeout: Optional[float] = None, args: tuple = (),
                             kwargs: Optional[dict] = None):
        return await self.engine.collective_rpc(method=method, timeout=timeout, args=args, kwargs=kwargs)

    collective_rpc._laminar_returns = True
    collective_rpc.__doc__ = cls.collective_rpc.__doc__
    cls.collective_rpc = collective_rpc


def _apply() -> None:
    from verl_laminar.patches.import_hook import on_import

    on_import(EXTENSION_MODULE, _extend_worker)  # vLLM worker processes
    on_import(SERVER_MODULE, _return_rpc_results)  # the replica's server actor
    on_import(TARGET_MODULE, _wrap_adapter)  # CheckpointEngineWorker processes


RELAY_IN_PLACE_REFRESH = Patch("relay_in_place_refresh", TARGET, _apply)
