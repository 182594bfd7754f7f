"""verl plugin entry point (group ``verl.plugins``): registers everything verl_laminar provides.

verl imports this module at ``import verl`` in every process (driver, TaskRunner, workers, rollout servers) and
swallows any import error at DEBUG level. So registration runs at import, is idempotent, logs failures at
ERROR before re-raising, and :func:`check_registered` lets any caller (our trainer, tests,
``python -m verl_laminar.plugin --check``) fail loudly, naming what is missing.

What is registered:
* the ``cpu`` platform in verl's ``PlatformRegistry`` and, when this process runs on it, the CPU patches. A process
  runs on it when ``LAMINAR_CPU_PLATFORM=1`` / ``VERL_PLATFORM=cpu``, or when neither it nor the job's Ray cluster
  has an accelerator (:mod:`verl_laminar.platform.choice`);
* the relay checkpoint engine ``laminar`` and the trainer mode ``laminar``, each registered when verl first
  imports the module it extends (so ``import verl`` stays as cheap as without the plugin).

On a verl version we have not verified, verl's own trainers keep working (one WARNING per process); what needs
our patches (Laminar trainer, relay engine, CPU platform) fails when it is used, naming both versions.
"""

from __future__ import annotations

import logging
import sys
from typing import Callable

logger = logging.getLogger("verl_laminar.plugin")

_DONE: dict[str, str] = {}  # component -> short description of what was registered


class PluginRegistrationError(RuntimeError):
    pass


class _Deferred(Exception):
    """A component that cannot register yet and will be registered by the module it waits for."""


def _register_cpu_platform() -> str:
    cpu_module = sys.modules.get("verl_laminar.platform.cpu")
    if cpu_module is not None and not hasattr(cpu_module, "PlatformCPU"):
        # That module's own import of verl brought us here; it calls register() again once it is complete.
        raise _Deferred("verl_laminar.platform.cpu is still being imported")
    from verl.plugin.platform import platform_manager
    from verl.plugin.platform.platform_manager import PlatformRegistry

    from verl_laminar.patches import PatchVersionError, installed_verl_version, unverified_verl_message, verl_verified
    from verl_laminar.platform import cpu

    if PlatformRegistry.get(cpu.PLATFORM_NAME) is not cpu.PlatformCPU:
        PlatformRegistry.register(platform=cpu.PLATFORM_NAME)(cpu.PlatformCPU)
    decision = cpu.this_process_decision()
    if not decision.cpu:
        return f"registered (inactive: {decision.reason})"
    current = platform_manager._current_platform
    if not isinstance(current, cpu.PlatformCPU):
        # Set it rather than wait for verl's detection: that probes nvidia/huawei/amd first, so an explicit
        # LAMINAR_CPU_PLATFORM=1 on a host with an accelerator would lose; and a platform resolved before the
        # plugins loaded fell back to CUDA, which cannot work here.
        platform_manager.set_platform(cpu.PlatformCPU())
    if not verl_verified():
        # After set_platform (which reads device_name): from here on the platform's first use raises.
        message = unverified_verl_message("The CPU platform (its patches)", installed_verl_version())
        cpu.refuse(message, PatchVersionError)
        return f"refused (untested verl {installed_verl_version()}; fails at first use): {decision.reason}"
    from verl_laminar.patches import apply_patch
    from verl_laminar.patches.cpu_config import CPU_CONFIG_DEFAULTS
    from verl_laminar.patches.cpu_runtime import FSDP_ENGINES, GLOO_PROCESS_GROUP
    from verl_laminar.patches.relay_refresh import RELAY_IN_PLACE_REFRESH
    from verl_laminar.patches.vllm_reload import VLLM_LAYERWISE_RELOAD
    from verl_laminar.patches.weight_sync_guard import WEIGHT_SYNC_FAIL_FAST
    from verl_laminar.platform.vllm_dist import check as check_vllm_dist

    # weight_sync_fail_fast guards a hang that GPUs share and relay_in_place_refresh saves GPU refreshes TP-1 of
    # every TP copies; both are applied with the CPU patches only, because a run on a host with an accelerator
    # gets none of ours until it has been checked on one (see patches/README.md). The guard comes last so that
    # it wraps the in-place refresh too (its errors become WeightSyncError like the bucket path's).
    for patch in (GLOO_PROCESS_GROUP, FSDP_ENGINES, CPU_CONFIG_DEFAULTS, VLLM_LAYERWISE_RELOAD, RELAY_IN_PLACE_REFRESH,
                  WEIGHT_SYNC_FAIL_FAST):
        apply_patch(patch)
    check_vllm_dist()
    return f"active: {decision.reason}"


def _register_relay_backend() -> str:
    from verl_laminar.patches import installed_verl_version, verl_verified

    if not verl_verified():
        # Only Laminar runs use it, and they refuse an untested verl; registering would import our backend
        # inside verl's own import of its checkpoint engines, which every run needs.
        return f"not registered (untested verl {installed_verl_version()})"
    # Deferred until verl imports its checkpoint engines: the backend pulls in verl's rollout utilities, which
    # processes that never sync weights (reward workers, the driver) should not pay for at ``import verl``.
    from verl_laminar.patches.import_hook import on_import

    def _register(_module) -> None:
        if "verl_laminar.relay.verl_backend" in sys.modules:
            # That module's own import triggered this hook; it registers itself when its import completes.
            return
        try:
            from verl_laminar.relay.verl_backend import register_relay_backend

            register_relay_backend()
        except Exception as e:  # fault boundary: a failure here would break verl's import for every run
            logger.error("verl_laminar: registering checkpoint engine 'laminar' failed (only runs that use it "
                         "fail): %s: %s", type(e).__name__, e, exc_info=True)

    on_import("verl.checkpoint_engine", _register)
    return "checkpoint engine 'laminar' (registered when verl.checkpoint_engine is imported)"


def _register_laminar_split() -> str:
    from verl_laminar.patches import apply_patch, installed_verl_version, verl_verified

    if not verl_verified():
        return f"not applied (untested verl {installed_verl_version()}; the Laminar trainer refuses to run)"
    from verl_laminar.patches.laminar_split import LAMINAR_SPLIT

    # every platform: it acts only on configs with trainer_mode=laminar, before verl's validate_config
    apply_patch(LAMINAR_SPLIT)
    return "colocated recipes are split before verl checks the config (trainer_mode=laminar only)"


def _register_laminar_trainer() -> str:
    # Deferred until verl imports its v1 trainers (what TaskRunnerV1 does before get_trainer_cls).
    from verl_laminar.trainer import install

    return install()


# Ordered registration steps: (component name, function returning a description).
_COMPONENTS: list[tuple[str, Callable[[], str]]] = [
    ("platform:cpu", _register_cpu_platform),
    ("checkpoint_engine:laminar", _register_relay_backend),
    ("config:laminar_split", _register_laminar_split),
    ("trainer:laminar", _register_laminar_trainer),
]


def register() -> dict[str, str]:
    """Register every component once per process; raise ``PluginRegistrationError`` naming failures."""
    from verl_laminar.patches import warn_if_unverified_verl

    warn_if_unverified_verl()
    failed = []
    for name, fn in _COMPONENTS:
        if name in _DONE:
            continue
        try:
            _DONE[name] = fn()
        except _Deferred as e:
            logger.debug("verl_laminar: %s deferred: %s", name, e)
        except Exception as e:  # fault boundary: verl would hide this at DEBUG, so surface it loudly here
            logger.error("verl_laminar: registering %s failed: %s: %s", name, type(e).__name__, e)
            failed.append((name, e))
    if failed:
        names = ", ".join(n for n, _ in failed)
        raise PluginRegistrationError(f"verl_laminar could not register: {names}") from failed[0][1]
    return dict(_DONE)


def registered() -> dict[str, str]:
    return dict(_DONE)


def check_registered(required: tuple[str, ...] | None = None) -> dict[str, str]:
    """Return what is registered; raise naming every required component that is not."""
    required = required or tuple(name for name, _ in _COMPONENTS)
    missing = [name for name in required if name not in _DONE]
    if missing:
        raise PluginRegistrationError(
            f"verl_laminar components not registered in this process: {', '.join(missing)} "
            f"(registered: {sorted(_DONE) or 'nothing'}). Is verl-laminar installed in this environment "
            "(pip install -e .) and VERL_USE_EXTERNAL_PLUGINS not excluding 'laminar'? "
            "Run `python -m verl_laminar.plugin --check` for the error."
        )
    return dict(_DONE)


def _main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import verl  # noqa: F401  (loads the entry points, as every verl process does)

    try:
        register()
        for name, what in check_registered().items():
            logger.info("%-24s %s", name, what)
    except PluginRegistrationError as e:
        logger.error("%s", e)
        sys.exit(1)


if __name__ == "__main__":
    _main()
else:
    register()
