"""Laminar's trainer (``trainer.v1.trainer_mode=laminar``).

``install()`` registers it lazily: ``laminar_trainer`` (which runs ``@register_trainer("laminar")``) is imported
right after verl imports ``verl.trainer.ppo.v1`` (what verl's TaskRunner does before ``get_trainer_cls``), so a
process that never touches verl's v1 trainers pays nothing.

That import runs inside verl's own import of its v1 trainers, so it must never break them: on an untested verl
version, or when our module fails to import, a stand-in is registered as ``laminar`` instead. verl's sync and
async trainers then run as without the plugin; only a run that builds the ``laminar`` trainer fails, with the
reason (``PatchVersionError`` naming both verl versions, or ``TrainerUnavailableError`` with the import error).
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

TRAINER_NAME = "laminar"
TRAINER_MODULE = "verl_laminar.trainer.laminar_trainer"
# registers trainer_mode=separate_async_relays, the benchmark's separate_async baseline on CPU
BASELINES_MODULE = "verl_laminar.trainer.baselines"


class TrainerUnavailableError(RuntimeError):
    pass


def _register_stand_in(error: Exception) -> None:
    """Register a ``laminar`` trainer whose construction raises ``error`` (the reason the real one is missing)."""
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer, register_trainer

    class LaminarTrainerUnavailable(PPOTrainer):
        """Stands in for LaminarTrainer; verl's TaskRunner builds the trainer first, so the run stops there."""

        def __new__(cls, *args, **kwargs):  # __new__: PPOTrainer is abstract, __init__ would never be reached
            raise error.with_traceback(None)  # one fresh traceback per attempt, the cause kept

    register_trainer(TRAINER_NAME)(LaminarTrainerUnavailable)


def _import_trainer(_module: object) -> None:
    import importlib

    from verl_laminar.patches import (
        PatchVersionError,
        installed_verl_version,
        unverified_verl_message,
        verl_verified,
        warn_if_unverified_verl,
    )

    if not verl_verified():
        warn_if_unverified_verl()
        error: Exception = PatchVersionError(unverified_verl_message(
            f"The Laminar trainer (trainer.v1.trainer_mode={TRAINER_NAME})", installed_verl_version()))
    else:
        try:
            importlib.import_module(TRAINER_MODULE)
            _import_baselines()
            return
        except Exception as e:  # fault boundary (plugin registration): keep verl's own trainers importable
            logger.error("verl_laminar: importing %s failed, trainer %r is unavailable: %s: %s",
                         TRAINER_MODULE, TRAINER_NAME, type(e).__name__, e, exc_info=True)
            error = TrainerUnavailableError(
                f"trainer {TRAINER_NAME!r} is unavailable: importing {TRAINER_MODULE} failed with "
                f"{type(e).__name__}: {e} (traceback logged at start-up; run `python -c 'import {TRAINER_MODULE}'`)")
            error.__cause__ = e
    try:
        _register_stand_in(error)
    except (ImportError, AttributeError, TypeError, ValueError) as e:  # an untested verl may have moved these
        logger.warning("verl_laminar: trainer %r not registered (%s); verl will report it as unknown",
                       TRAINER_NAME, e)


def _import_baselines() -> None:
    """The benchmark's baseline trainers; a failure only makes them unknown to verl, never the Laminar trainer."""
    import importlib

    try:
        importlib.import_module(BASELINES_MODULE)
    except Exception as e:  # fault boundary (plugin registration), as for the Laminar trainer above
        logger.error("verl_laminar: importing %s failed; trainer_mode=separate_async_relays is unavailable: %s: %s",
                     BASELINES_MODULE, type(e).__name__, e)


def install() -> str:
    from verl_laminar.patches.import_hook import on_import

    on_import("verl.trainer.ppo.v1", _import_trainer)
    return f"trainer '{TRAINER_NAME}' (imported with verl.trainer.ppo.v1 from {TRAINER_MODULE})"
