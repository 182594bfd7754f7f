"""``laminar.helpers``: the key's values, and the report of where verl's helpers really are (``fleet.helpers``).
The placement itself, on a real Ray node, is tested in tests/config/test_task_runner_pin_on_cpu.py; on 3 emulated
machines by tests/fleet/test_laminar_on_emulated_cluster_on_cpu.py (every helper on the TaskRunner's node)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from verl_laminar.config.schema import LaminarConfig
from verl_laminar.config.sections import LaminarConfigError
from verl_laminar.fleet import helpers


def test_the_key_defaults_to_the_task_runners_node_and_refuses_other_values():
    assert LaminarConfig.from_omegaconf({}).helpers == "task_runner"
    assert LaminarConfig.from_omegaconf({"helpers": "spread"}).helpers == "spread"
    with pytest.raises(LaminarConfigError, match="helpers"):
        LaminarConfig.from_omegaconf({"helpers": "head"})


def test_only_laminar_runs_with_task_runner_place_the_helpers():
    laminar = OmegaConf.create({"trainer": {"v1": {"trainer_mode": "laminar"}}})
    assert helpers.on_task_runner(laminar)
    assert not helpers.on_task_runner(OmegaConf.merge(laminar, {"laminar": {"helpers": "spread"}}))
    assert not helpers.on_task_runner(OmegaConf.create({"trainer": {"v1": {"trainer_mode": "separate_async"}}}))
    with pytest.raises(ValueError, match="laminar.helpers='head'"):
        helpers.on_task_runner(OmegaConf.merge(laminar, {"laminar": {"helpers": "head"}}))


def test_the_report_counts_helpers_on_the_node_and_names_the_others():
    report = helpers.placement_report({"storage": ["a"], "agent_loop": ["a", "b", "a"], "reward": []}, "a")
    assert report["on_node"] == {"storage": 1, "agent_loop": 2, "reward": 0}
    assert report["total"] == {"storage": 1, "agent_loop": 3, "reward": 0}
    assert report["elsewhere"] == {"agent_loop": ["b"]}


def test_storage_keeps_a_node_resource_the_user_named():
    calls = []

    def original(n, required_node_resource=None):
        calls.append((n, required_node_resource))
        return ["theirs"] * n

    assert helpers.storage_strategies(original)(2, required_node_resource="storage") == ["theirs", "theirs"]
    assert calls == [(2, "storage")]
