"""`+laminar=enabled` composes on verl 0.9.1's own config, user overrides win, and without it nothing changes.

How: Hydra's compose API runs in this process against main_ppo's config directory (the search-path plugin is
honoured there as in main_ppo), while one real `python -m verl.trainer.main_ppo +laminar=enabled --info all` runs
alongside; its printed search path and config are compared with the compose result, so the fast path is checked
against the real entry point. (Importing main_ppo costs ~15 s; one run is all the budget allows.)
"""

from __future__ import annotations

import copy
import importlib.util
import os
import re
import subprocess
import sys

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from laminar_testing import REPO
from verl_laminar.config import LaminarConfig, validate_and_migrate
from verl_laminar.config.legacy_reward import verl_reward_defaults

VERL_CONFIG = os.path.join(list(importlib.util.find_spec("verl").submodule_search_locations)[0], "trainer", "config")
ENABLED = REPO / "verl_laminar" / "config" / "laminar" / "enabled.yaml"
# a user's recipe on top of +laminar=enabled: overrides of ours and of verl's keys, plus legacy reward keys
USER = [
    "+laminar=enabled",
    "trainer.v1.trainer_mode=sync",
    "laminar.repack.c_max=0.5",
    "laminar.replicas=4",
    "actor_rollout_ref.actor.clip_ratio_high=0.3",
    "reward_model.reward_manager=dapo",
    "+reward_model.reward_kwargs.max_resp_len=64",
    "custom_reward_function.path=my_reward.py",
]


@pytest.fixture(scope="module")
def composed(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("main_ppo")
    main_ppo = subprocess.Popen(
        ["nice", sys.executable, "-m", "verl.trainer.main_ppo", "+laminar=enabled", "--info", "all"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
    )
    jobs = {"default": [], "enabled": ["+laminar=enabled"], "user": USER}
    with initialize_config_dir(config_dir=VERL_CONFIG, version_base=None):
        configs = {name: compose(config_name="ppo_trainer", overrides=overrides) for name, overrides in jobs.items()}
    stdout, stderr = main_ppo.communicate(timeout=300)
    assert main_ppo.returncode == 0, stderr[-2000:]
    configs["__info__"] = stdout
    return configs


def plain(cfg) -> dict:
    return OmegaConf.to_container(cfg)


def leaves(node, prefix="") -> dict:
    if not isinstance(node, dict):
        return {prefix[:-1]: node}
    return {k: v for key, value in node.items() for k, v in leaves(value, f"{prefix}{key}.").items()}


def test_main_ppo_finds_the_group_through_the_search_path_plugin(composed):
    info = composed["__info__"]
    assert "VerlLaminarSearchPathPlugin" in info.split("Config search path")[0]
    search_path = info.split("Config search path")[1].split("Defaults Tree")[0]
    assert re.search(r"^\|\s*verl-laminar\s*\|\s*pkg://verl_laminar\.config\s*\|$", search_path, re.M), search_path
    printed = yaml.safe_load(info.split("\nConfig\n******\n")[1])
    assert printed == plain(composed["enabled"])  # main_ppo composes exactly what the compose API does


def test_enabled_selects_trainer_relay_engine_clip_higher_and_the_laminar_block(composed):
    cfg = composed["enabled"]
    assert cfg.trainer.v1.trainer_mode == "laminar"
    engine = cfg.actor_rollout_ref.rollout.checkpoint_engine
    assert (engine.backend, engine.custom_backend_module) == ("laminar", "verl_laminar.relay.verl_backend")
    assert (cfg.actor_rollout_ref.actor.clip_ratio_low, cfg.actor_rollout_ref.actor.clip_ratio_high) == (0.2, 0.28)
    assert LaminarConfig.from_omegaconf(cfg.laminar) == LaminarConfig()
    # repack's aborts find vLLM requests by the ids Laminar gave them (tests/foundation: the vLLM/verl contract)
    assert cfg.ray_kwargs.ray_init.runtime_env.env_vars.VLLM_DISABLE_REQUEST_ID_RANDOMIZATION == "1"


def test_enabled_changes_exactly_the_keys_of_enabled_yaml(composed):
    default, enabled = leaves(plain(composed["default"])), leaves(plain(composed["enabled"]))
    ours = leaves(OmegaConf.to_container(OmegaConf.load(ENABLED)))
    changed = {k for k in enabled if default.get(k, object()) != enabled[k]}
    assert changed == {k for k in ours if default.get(k, object()) != ours[k]}
    assert all(enabled[k] == ours[k] for k in ours)
    assert set(default) - set(enabled) == set()


def test_user_overrides_win_over_the_group(composed):
    cfg = composed["user"]
    assert cfg.trainer.v1.trainer_mode == "sync"
    assert cfg.laminar.repack.c_max == 0.5 and cfg.laminar.repack.interval_s is None  # the platform decides
    assert cfg.actor_rollout_ref.actor.clip_ratio_high == 0.3 and cfg.actor_rollout_ref.actor.clip_ratio_low == 0.2


def test_without_the_flag_the_config_is_verls_default(composed):
    default = plain(composed["default"])
    assert "laminar" not in default and default["trainer"]["v1"]["trainer_mode"] == "sync"
    assert default["actor_rollout_ref"]["rollout"]["checkpoint_engine"]["backend"] == "naive"
    # verl ships its flattened default config; it omits only the model_engine selector
    with open(os.path.join(VERL_CONFIG, "_generated_ppo_trainer.yaml")) as f:
        shipped = yaml.safe_load(f)
    assert {k: v for k, v in default.items() if k != "model_engine"} == shipped
    # the legacy-key migration compares against verl's reward defaults: they are what the composed config holds
    assert plain(verl_reward_defaults().reward) == default["reward"]


def test_legacy_reward_keys_migrate_on_a_composed_config(composed):
    cfg = copy.deepcopy(composed["user"])
    assert cfg.reward.reward_manager.name == "naive"  # what verl 0.9.1 would have used, silently
    lam = validate_and_migrate(cfg)
    assert cfg.reward.reward_manager.name == "dapo" and cfg.reward.reward_kwargs.max_resp_len == 64
    assert cfg.reward.custom_reward_function.path == "my_reward.py"
    assert lam.replicas == 4 and lam.repack.c_max == 0.5
