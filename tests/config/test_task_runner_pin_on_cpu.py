"""``+laminar=enabled`` starts verl's TaskRunner on the driver's node: the wrapper, and that a real Ray actor
started through it lands on the calling node, with verl's helpers (TransferQueue storage units, reward workers)
placed on that node inside its ``run`` under ``laminar.helpers=task_runner`` and left to verl under ``spread``."""

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


def test_the_task_runner_starts_on_the_drivers_node_and_places_verls_helpers_there(monkeypatch):
    import ray
    from omegaconf import OmegaConf

    from verl_laminar.patches import task_runner

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        @ray.remote(num_cpus=0)
        class Runner:  # verl's TaskRunnerV1 in miniature: what its run sees of the helpers' placement
            def __init__(self) -> None:
                self.runs = 0

            def run(self, config):
                from transfer_queue.storage.bootstrap import simple_storage_bootstrap as tq_boot
                from verl.trainer.ppo.v1 import trainer_base

                self.runs += 1
                return {"node": ray.get_runtime_context().get_node_id(),
                        "reward_manager": trainer_base.RewardLoopManager.__name__,
                        "storage": [(s.node_id, s.soft) for s in
                                    tq_boot.get_node_round_robin_scheduling_strategies(3)]}

        here = ray.get_runtime_context().get_node_id()
        laminar = OmegaConf.create({"trainer": {"v1": {"trainer_mode": "laminar"}}, "laminar": {}})
        actor = OnDriverNode(Runner).remote()
        seen = ray.get(actor.run.remote(laminar))
        assert seen["node"] == here
        assert seen["reward_manager"] == "LaminarRewardLoopManager"
        assert seen["storage"] == [(here, True)] * 3  # verl's hard round-robin replaced by this node, soft
        spread = OmegaConf.merge(laminar, {"laminar": {"helpers": "spread"}})
        seen = ray.get(actor.run.remote(spread))
        assert seen["reward_manager"] == "RewardLoopManager" and [s for s, _ in seen["storage"]] == [here] * 3
        assert all(hard is False for _, hard in seen["storage"])  # verl's own strategy (hard affinity)
        ray.kill(actor)

        asked = {}

        class Spy:
            def options(self, **options):
                asked.update(options)

        monkeypatch.setattr(task_runner, "laminar_runner", lambda cls: Spy())
        OnDriverNode(Runner).options(num_cpus=0, scheduling_strategy="SPREAD")
        assert asked["scheduling_strategy"] == "SPREAD"  # a placement the caller chose is kept
    finally:
        if started:
            ray.shutdown()
