"""Legacy top-level reward keys (ignored by verl 0.9.1) are moved to reward.* loudly, or refused."""

from __future__ import annotations

import importlib.util
import logging
import os

import pytest
from omegaconf import DictConfig, OmegaConf

from verl_laminar.config import LaminarConfigError, check_legacy_reward_keys
from verl_laminar.config.legacy_reward import verl_reward_defaults

VERL_CONFIG = os.path.join(list(importlib.util.find_spec("verl").submodule_search_locations)[0], "trainer", "config")


def legacy_config(**dotted) -> DictConfig:
    """verl's legacy_reward_impl.yaml plus its reward group, as a composed config holds them (struct mode)."""
    cfg = OmegaConf.merge(OmegaConf.load(os.path.join(VERL_CONFIG, "legacy_reward_impl.yaml")), verl_reward_defaults())
    OmegaConf.set_struct(cfg, True)
    for key, value in dotted.items():
        OmegaConf.update(cfg, key, value, force_add=True)
    return cfg


def test_untouched_config_is_left_alone():
    cfg = legacy_config()
    before = OmegaConf.to_container(cfg)
    assert check_legacy_reward_keys(cfg) == [] and OmegaConf.to_container(cfg) == before


def test_legacy_keys_move_to_reward_with_a_warning(caplog):
    kwargs = {"overlong_buffer_cfg": {"enable": True, "len": 4096}, "max_resp_len": 16384}
    cfg = legacy_config(
        **{
            "reward_model.reward_manager": "dapo",
            "reward_model.reward_kwargs": kwargs,
            "custom_reward_function.path": "my_reward.py",
            "custom_reward_function.name": "score",
            "reward_model.rollout.tensor_model_parallel_size": 4,
            "reward_model.rollout.cudagraph_capture_sizes": [1, 2],
            "sandbox_fusion.url": "http://sandbox:8080",
        }
    )
    with caplog.at_level(logging.WARNING, logger="verl_laminar.config.legacy_reward"):
        moved = check_legacy_reward_keys(cfg)
    assert cfg.reward.reward_manager.name == "dapo"
    assert OmegaConf.to_container(cfg.reward.reward_kwargs) == kwargs
    assert (cfg.reward.custom_reward_function.path, cfg.reward.custom_reward_function.name) == ("my_reward.py", "score")
    assert cfg.reward.reward_model.rollout.tensor_model_parallel_size == 4
    assert list(cfg.reward.reward_model.rollout.cudagraph_capture_sizes) == [1, 2]
    assert cfg.reward.sandbox_fusion.url == "http://sandbox:8080"
    assert ("reward_model.reward_manager", "reward.reward_manager.name") in moved and len(moved) == 7
    assert "reward_model.reward_manager='dapo' is a legacy key that verl 0.9.1 ignores; using reward.reward_manager.name='dapo'" in caplog.text
    # the legacy values are cleared: a second call (another process validating the same config) is silent
    assert cfg.reward_model.reward_manager is None and cfg.custom_reward_function.path is None
    caplog.clear()
    assert check_legacy_reward_keys(cfg) == [] and caplog.text == ""


def test_same_value_on_both_keys_is_not_a_conflict():
    cfg = legacy_config(**{"reward_model.reward_manager": "dapo", "reward.reward_manager.name": "dapo"})
    assert check_legacy_reward_keys(cfg) == [("reward_model.reward_manager", "reward.reward_manager.name")]


@pytest.mark.parametrize(
    "dotted, message",
    [
        (
            {"reward_model.reward_manager": "dapo", "reward.reward_manager.name": "prime"},
            "reward_model.reward_manager='dapo' conflicts with reward.reward_manager.name='prime': verl 0.9.1 ignores "
            "reward_model.reward_manager; remove reward_model.reward_manager and keep reward.reward_manager.name",
        ),
        (
            {"reward_model.reward_kwargs": {"max_resp_len": 8}, "reward.reward_kwargs": {"max_resp_len": 16}},
            "reward_model.reward_kwargs={'max_resp_len': 8} conflicts with reward.reward_kwargs={'max_resp_len': 16}",
        ),
        (
            {"reward_model.overlong_buffer.enable": True},
            "reward_model.overlong_buffer.enable=True is not read by verl 0.9.1 and has no reward.* equivalent: "
            "DAPO's overlong penalty is reward.reward_kwargs.overlong_buffer_cfg.*",
        ),
        ({"reward_model.model.trust_remote_code": True}, "remove it and use the reward.* keys"),
    ],
)
def test_conflicting_or_unmappable_legacy_keys_are_refused(dotted, message):
    cfg = legacy_config(**dotted)
    with pytest.raises(LaminarConfigError) as err:
        check_legacy_reward_keys(cfg)
    assert message in str(err.value)
    assert cfg.reward.reward_manager.name == dotted.get("reward.reward_manager.name", "naive")  # nothing half-migrated


def test_every_error_is_reported_at_once():
    cfg = legacy_config(**{"reward_model.reward_manager": "dapo", "reward.reward_manager.name": "prime", "reward_model.foo": 1})
    with pytest.raises(LaminarConfigError) as err:
        check_legacy_reward_keys(cfg)
    assert "reward_model.reward_manager='dapo'" in str(err.value) and "reward_model.foo=1" in str(err.value)
