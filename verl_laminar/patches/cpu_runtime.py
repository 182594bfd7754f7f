"""Patches that let verl 0.9.1's worker code run on the CPU platform (ledger: patches/README.md).

* ``cpu_gloo_process_group``: verl builds the backend string ``cpu:gloo,<device>:<backend>``, which on CPU is
  ``cpu:gloo,cpu:gloo`` and torch rejects the duplicate device. On CPU the one backend is plain ``gloo``.
* ``cpu_fsdp_engines``: the FSDP/FSDP2 engines are registered only for devices ``cuda`` and ``npu``, although
  their code is device-agnostic (torch FSDP2 ``fully_shard`` works on a CPU mesh with gloo). On CPU, an engine
  lookup that misses falls back to the ``cuda`` registration of the same class.
* ``cpu_offload_no_pin``: ``_build_fsdp_module`` hard-codes ``CPUOffloadPolicy(pin_memory=True)`` for the
  reference model; pinning needs an accelerator. Applied together with the engine lookup, when the FSDP module
  is first needed, so processes that never train do not import it.
"""

from __future__ import annotations

import functools
import logging

from verl_laminar.patches import Patch

logger = logging.getLogger(__name__)


def _apply_gloo_backend() -> None:
    import verl.utils.distributed as dist

    original = dist.initialize_global_process_group_ray

    @functools.wraps(original)
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        if backend is None or backend.replace(" ", "") in ("cpu:gloo,cpu:gloo",):
            backend = "gloo"
        return original(timeout_second=timeout_second, backend=backend)

    dist.initialize_global_process_group_ray = initialize_global_process_group_ray
    # Modules that imported the name before us keep the old binding; rebind them too.
    import sys

    for modname in ("verl.workers.engine_workers", "verl.checkpoint_engine.base"):
        mod = sys.modules.get(modname)
        if mod is not None and getattr(mod, "initialize_global_process_group_ray", None) is original:
            mod.initialize_global_process_group_ray = initialize_global_process_group_ray


def _apply_offload_no_pin() -> None:
    from verl.workers.engine.fsdp import transformer_impl

    base = transformer_impl.CPUOffloadPolicy
    if getattr(base, "_laminar_no_pin", False):
        return

    class CPUOffloadPolicyNoPin(base):  # type: ignore[misc, valid-type]
        _laminar_no_pin = True

        def __init__(self, pin_memory: bool = True, **kw):
            super().__init__(pin_memory=False, **kw)

    transformer_impl.CPUOffloadPolicy = CPUOffloadPolicyNoPin


def _patch_engine_registry(base_module) -> None:
    from verl.utils.device import get_device_name

    EngineRegistry = base_module.EngineRegistry
    original = EngineRegistry.get_engine_cls.__func__

    def get_engine_cls(cls, model_type: str, backend: str):
        if get_device_name() == "cpu" and backend in ("fsdp", "fsdp2"):
            import verl.workers.engine.fsdp  # noqa: F401  (registers the FSDP engines)

            registry = cls._engines.get(model_type, {}).get(backend, {})
            if "cpu" not in registry and "cuda" in registry:
                registry["cpu"] = registry["cuda"]
                logger.info("CPU platform: using %s for %s/%s", registry["cuda"].__name__, model_type, backend)
            apply_offload_no_pin()
        return original(cls, model_type, backend)

    EngineRegistry.get_engine_cls = classmethod(get_engine_cls)


def _apply_fsdp_engines() -> None:
    # Deferred: importing verl.workers.engine pulls in every training backend (seconds per process).
    from verl_laminar.patches.import_hook import on_import

    on_import("verl.workers.engine.base", _patch_engine_registry)


GLOO_PROCESS_GROUP = Patch("cpu_gloo_process_group", "verl.utils.distributed.initialize_global_process_group_ray",
                           _apply_gloo_backend)
FSDP_ENGINES = Patch("cpu_fsdp_engines", "verl.workers.engine.base.EngineRegistry.get_engine_cls",
                     _apply_fsdp_engines)
OFFLOAD_NO_PIN = Patch("cpu_offload_no_pin", "verl.workers.engine.fsdp.transformer_impl.CPUOffloadPolicy",
                       _apply_offload_no_pin)


def apply_offload_no_pin() -> None:
    from verl_laminar.patches import apply_patch

    apply_patch(OFFLOAD_NO_PIN)
