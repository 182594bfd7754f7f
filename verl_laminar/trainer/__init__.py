"""Laminar's trainer (``trainer.v1.trainer_mode=laminar``).

``install()`` registers it lazily: ``laminar_trainer`` (which runs ``@register_trainer("laminar")``) is imported
right after verl imports ``verl.trainer.ppo.v1`` (what verl's TaskRunner does before ``get_trainer_cls``), so a
process that never touches verl's v1 trainers pays nothing.
"""

from __future__ import annotations

TRAINER_MODULE = "verl_laminar.trainer.laminar_trainer"


def _import_trainer(_module: object) -> None:
    import importlib

    importlib.import_module(TRAINER_MODULE)


def install() -> str:
    from verl_laminar.patches.import_hook import on_import

    on_import("verl.trainer.ppo.v1", _import_trainer)
    return f"trainer 'laminar' (imported with verl.trainer.ppo.v1 from {TRAINER_MODULE})"
