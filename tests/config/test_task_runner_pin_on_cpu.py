"""``+laminar=enabled`` starts verl's TaskRunner on the driver's node: the wrapper, and that a real Ray actor
started through it lands on the calling node with the affinity asked for."""

from __future__ import annotations

import sys
import types

import pytest

from verl_laminar.patches.task_runner import MAIN_MODULE, OnDriverNode, main_modules, pin_task_runner

pytestmark = pytest.mark.ray_driver  # the second test starts a Ray driver


def test_pin_wraps_main_ppo_as_imported_and_as_main_once(monkeypatch):
    imported = types.ModuleType(MAIN_MODULE)
    imported.TaskRunnerV1 = object()
    as_main = types.ModuleType("__main__")
    as_main.__spec__ = types.SimpleNamespace(name=MAIN_MODULE)
    as_main.TaskRunnerV1 = object()
    monkeypatch.setitem(sys.modules, MAIN_MODULE, imported)
    monkeypatch.setitem(sys.modules, "__main__", as_main)
    assert main_modules() == [imported, as_main]
    assert pin_task_runner() == 2
    assert isinstance(imported.TaskRunnerV1, OnDriverNode) and isinstance(as_main.TaskRunnerV1, OnDriverNode)
    assert pin_task_runner() == 0  # idempotent
    other = types.ModuleType("__main__")  # pytest, or another program: left alone
    other.TaskRunnerV1 = object()
    monkeypatch.setitem(sys.modules, "__main__", other)
    monkeypatch.delitem(sys.modules, MAIN_MODULE)
    assert main_modules() == [] and pin_task_runner() == 0


def test_the_task_runner_starts_on_the_drivers_node_with_a_soft_affinity():
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        @ray.remote(num_cpus=0)
        class Runner:
            def node(self) -> str:
                return ray.get_runtime_context().get_node_id()

        asked = {}

        class Spy:
            def options(self, **options):
                asked.update(options)
                return Runner.options(**options)

        actor = OnDriverNode(Spy()).remote()
        here = ray.get_runtime_context().get_node_id()
        assert ray.get(actor.node.remote()) == here
        strategy = asked["scheduling_strategy"]
        assert isinstance(strategy, NodeAffinitySchedulingStrategy) and strategy.node_id == here and strategy.soft
        asked.clear()
        OnDriverNode(Spy()).options(num_cpus=0, scheduling_strategy="SPREAD")
        assert asked["scheduling_strategy"] == "SPREAD"  # a placement the caller chose is kept
        ray.kill(actor)
    finally:
        if started:
            ray.shutdown()
