"""Patches for verl 0.9.1 bugs that are not CPU-specific (applied with the Laminar trainer, on any platform).

They run when ``laminar_trainer`` is imported, which happens only on a verified verl (the trainer hook in
``verl_laminar/trainer/__init__.py`` registers a refusing stand-in otherwise); importing that module directly on
an untested verl raises ``PatchVersionError`` here, since the Laminar trainer is built on these fixes.

``separate_async_logger_flush``: ``PPOTrainerSeparateAsync._setup`` calls ``logger.info(..., flush=True)`` in its
``hybrid_engine=False`` branch (trainer_separate_async.py, "hybrid replicas disabled"), a print() keyword
that ``logging`` rejects with a TypeError, so every separate_async or Laminar run without colocated replicas
dies at start-up. The module's logger is wrapped in an adapter that drops ``flush``.
"""

from __future__ import annotations

import logging

from verl_laminar.patches import Patch, apply_patch


class DropPrintKwargs(logging.LoggerAdapter):
    """A logger that ignores print()'s ``flush=`` keyword instead of raising."""

    def process(self, msg, kwargs):
        kwargs.pop("flush", None)
        return msg, kwargs


def _apply_logger_flush() -> None:
    import verl.trainer.ppo.v1.trainer_separate_async as sep

    if not isinstance(sep.logger, DropPrintKwargs):
        sep.logger = DropPrintKwargs(sep.logger, {})


SEPARATE_ASYNC_LOGGER_FLUSH = Patch("separate_async_logger_flush",
                                    "verl.trainer.ppo.v1.trainer_separate_async.logger", _apply_logger_flush)


def apply_verl_bug_patches() -> list[str]:
    applied = []
    for patch in (SEPARATE_ASYNC_LOGGER_FLUSH,):
        if apply_patch(patch):
            applied.append(patch.name)
    return applied
