"""``+laminar=enabled`` on a colocated recipe: the trainer/rollout split is made before verl checks the config.

verl's ``main_ppo.main`` calls ``auto_set_device(config)`` and then ``validate_config(config)``, long before the
Laminar trainer is built. Without this patch verl checks the colocated layout the run will never have: a recipe on
3 GPUs with 8 prompts x 4 responses is refused (32 samples do not divide over 3 ranks) although its Laminar trainer
gets 1 GPU, and a layout verl would refuse after the split passes unchecked. Patch ``laminar_split_before_validate``
(ledger: patches/README.md) wraps ``verl.utils.device.auto_set_device`` on every platform; for a config whose
``trainer.v1.trainer_mode`` is ``laminar`` (and only then) it applies ``config.split.apply_split`` first, so
verl's own checks, Ray's sizes and the CPU defaults all see the split the run will have. The Laminar trainer's own
``prepare_config`` then finds a standalone config and keeps it. The same hook starts verl's TaskRunner on the
driver's node (``patches/task_runner.py``).
"""

from __future__ import annotations

import functools
from typing import Any

from omegaconf import DictConfig

from verl_laminar.patches import Patch


def is_laminar(config: Any) -> bool:
    from verl_laminar.fleet.helpers import is_laminar as laminar_mode

    return isinstance(config, DictConfig) and laminar_mode(config)


def _apply() -> None:
    import verl.utils.device as device

    original = device.auto_set_device

    @functools.wraps(original)
    def auto_set_device(config) -> None:
        if is_laminar(config):
            from verl_laminar.config.split import apply_split
            from verl_laminar.patches.task_runner import pin_task_runner

            apply_split(config)
            pin_task_runner()  # main passes TaskRunnerV1 right after this call: started on the driver's node
        original(config)

    device.auto_set_device = auto_set_device


LAMINAR_SPLIT = Patch("laminar_split_before_validate", "verl.utils.device.auto_set_device", _apply)
