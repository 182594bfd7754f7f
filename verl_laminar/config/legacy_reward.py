"""Legacy top-level reward keys: migrate them to ``reward.*`` or refuse them, never ignore them.

verl 0.9.1 still accepts the pre-0.9 keys ``custom_reward_function.*``, ``reward_model.*`` and ``sandbox_fusion.*``
(its ``legacy_reward_impl.yaml`` declares them, all null) but no longer reads them: only ``reward.*`` is used. A
recipe written for older verl (``reward_model.reward_manager=dapo``, ``+reward_model.reward_kwargs...``) would train
with the naive reward manager and no overlong penalty without a word. Here every non-null legacy leaf is either
copied to its ``reward.*`` key with a WARNING naming both keys, or rejected when the new key holds a different,
non-default value (two sources of truth) or when the legacy key has no ``reward.*`` equivalent.

The defaults of the new keys are read from verl's own ``reward/reward.yaml``, so "the user set it" means "it differs
from what verl ships", whatever verl version is installed. (A new key set explicitly to its default value cannot be
told apart from an unset one; the legacy value wins there, with the warning.)
"""

from __future__ import annotations

import importlib.util
import logging
import os
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf, open_dict

from verl_laminar.config.schema import LaminarConfigError

logger = logging.getLogger(__name__)

LEGACY_ROOTS = ("custom_reward_function", "reward_model", "sandbox_fusion")

# legacy key -> the key verl 0.9.1 reads. A subtree mapping (reward_kwargs) moves as one value.
LEGACY_TO_NEW: dict[str, str] = {
    "custom_reward_function.path": "reward.custom_reward_function.path",
    "custom_reward_function.name": "reward.custom_reward_function.name",
    "reward_model.reward_manager": "reward.reward_manager.name",
    "reward_model.reward_kwargs": "reward.reward_kwargs",
    "reward_model.num_workers": "reward.num_workers",
    "reward_model.reward_loop_source": "reward.reward_manager.source",
    "reward_model.reward_loop_module_path": "reward.reward_manager.module.path",
    "reward_model.reward_loop_class_name": "reward.reward_manager.module.name",
    "reward_model.enable": "reward.reward_model.enable",
    "reward_model.enable_resource_pool": "reward.reward_model.enable_resource_pool",
    "reward_model.n_gpus_per_node": "reward.reward_model.n_gpus_per_node",
    "reward_model.nnodes": "reward.reward_model.nnodes",
    "reward_model.model.path": "reward.reward_model.model_path",
    "sandbox_fusion.url": "reward.sandbox_fusion.url",
    "sandbox_fusion.max_concurrent": "reward.sandbox_fusion.max_concurrent",
    "sandbox_fusion.memory_limit_mb": "reward.sandbox_fusion.memory_limit_mb",
}
# every legacy reward-model rollout option has a same-named key under the new reward model
LEGACY_PREFIXES: dict[str, str] = {"reward_model.rollout.": "reward.reward_model.rollout."}
# where an unmappable legacy key has a known successor, say so in the error
HINTS: dict[str, str] = {
    "reward_model.overlong_buffer": "DAPO's overlong penalty is reward.reward_kwargs.overlong_buffer_cfg.* "
    "(enable, len, penalty_factor, log) with reward.reward_manager.name=dapo",
}
_UNSET = object()


def new_key_for(legacy: str) -> Optional[str]:
    if legacy in LEGACY_TO_NEW:
        return LEGACY_TO_NEW[legacy]
    for old, new in LEGACY_PREFIXES.items():
        if legacy.startswith(old):
            return new + legacy[len(old) :]
    return None


def verl_reward_defaults() -> DictConfig:
    """verl's shipped ``reward`` group (what ``reward.*`` holds when nobody set it); found without importing verl."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise LaminarConfigError("verl is not installed: cannot read its reward defaults (pip install verl==0.9.1)")
    path = os.path.join(list(spec.submodule_search_locations)[0], "trainer", "config", "reward", "reward.yaml")
    if not os.path.isfile(path):
        raise LaminarConfigError(f"verl's reward defaults are not at {path}: verl's config layout changed")
    return OmegaConf.create({"reward": OmegaConf.load(path)})


def _set_leaves(node: Any, path: str) -> list[str]:
    """Dotted paths of the non-null values under ``node``; a mapped subtree (reward_kwargs) counts as one leaf."""
    if node is None:
        return []
    if path in LEGACY_TO_NEW or not isinstance(node, DictConfig):
        return [path]
    return [leaf for k in node for leaf in _set_leaves(node[k], f"{path}.{k}")]


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def check_legacy_reward_keys(cfg: DictConfig) -> list[tuple[str, str]]:
    """Move set legacy reward keys of ``cfg`` (in place) to ``reward.*``; returns the (old, new) pairs moved.

    Raises ``LaminarConfigError`` naming every legacy key that conflicts with its new key or has no new key. The
    moved legacy keys are reset to null, so a second call is a no-op.
    """
    defaults = verl_reward_defaults()
    moves: list[tuple[str, str, Any]] = []
    errors: list[str] = []
    for root in LEGACY_ROOTS:
        for old in _set_leaves(cfg.get(root), root):
            value = _plain(OmegaConf.select(cfg, old))
            new = new_key_for(old)
            if new is None:
                hint = next((h for k, h in HINTS.items() if old.startswith(k)), "remove it and use the reward.* keys")
                errors.append(f"{old}={value!r} is not read by verl 0.9.1 and has no reward.* equivalent: {hint}")
                continue
            current = _plain(OmegaConf.select(cfg, new, default=_UNSET))
            default = _plain(OmegaConf.select(defaults, new, default=None))
            if current is not _UNSET and current not in (None, default, value):
                errors.append(
                    f"{old}={value!r} conflicts with {new}={current!r}: verl 0.9.1 ignores {old}; "
                    f"remove {old} and keep {new}"
                )
                continue
            moves.append((old, new, value))
    if errors:
        raise LaminarConfigError("legacy reward keys cannot be migrated:\n  " + "\n  ".join(errors))
    with open_dict(cfg):
        for old, new, value in moves:
            logger.warning("%s=%r is a legacy key that verl 0.9.1 ignores; using %s=%r instead", old, value, new, value)
            OmegaConf.update(cfg, new, value, merge=False, force_add=True)
            OmegaConf.update(cfg, old, None, merge=False, force_add=True)
    return [(old, new) for old, new, _ in moves]
