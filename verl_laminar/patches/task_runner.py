"""verl's TaskRunner on the driver's machine, for ``+laminar=enabled`` runs (part of ``laminar_split_before_validate``).

``main_ppo.run_ppo`` starts ``TaskRunnerV1.remote()`` with no placement, so Ray may put it on any machine with a
free CPU. Under Laminar the TaskRunner is where the trainer's loop, the rollout router and the partial-response
pool (its log on that machine's disk) start: on a rollout machine, that machine's loss takes them with it, and
the TaskRunner's console reaches the driver only through Ray's log forwarding from another machine (on 3 emulated
machines the run's last lines, its end on the awaited events among them, were missing from the driver's output).
``pin_task_runner`` replaces the ``TaskRunnerV1`` that ``main`` is about to pass with one started with a soft
affinity to the driver's node: there when it has room (a head started with ``--num-cpus 0``, as KubeRay's default
head is, has none, and Ray places it elsewhere as before).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

logger = logging.getLogger(__name__)
MAIN_MODULE = "verl.trainer.main_ppo"


def laminar_runner(actor_cls: Any) -> Any:
    """verl's TaskRunner actor class with its ``run`` inside ``fleet.helpers.helpers_placed``: the helpers verl
    builds there (TransferQueue storage units, reward and agent-loop workers) start on this TaskRunner's node."""
    import ray

    class LaminarTaskRunner(actor_cls.__ray_actor_class__):
        def __init__(self) -> None:  # Ray builds an actor from a subclass only when it defines __init__ itself
            super().__init__()

        def run(self, config: Any) -> Any:
            from verl_laminar.fleet.helpers import helpers_placed

            with helpers_placed(config):
                return super().run(config)

    return ray.remote(LaminarTaskRunner)


class OnDriverNode:
    """An actor class whose ``remote()`` / ``options()`` add a soft affinity to the calling process's node and
    start ``laminar_runner``'s subclass (attributes other than those two are the wrapped class's)."""

    def __init__(self, actor_cls: Any) -> None:
        self._cls = actor_cls
        self._runner: Any = None

    def _placed(self, **options: Any) -> Any:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if "scheduling_strategy" not in options:
            node = ray.get_runtime_context().get_node_id()
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node, soft=True)
            logger.info("laminar: verl's TaskRunner starts on the driver's node %s when it has room", node)
        if self._runner is None:
            self._runner = laminar_runner(self._cls)
        return self._runner.options(**options)

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self._placed().remote(*args, **kwargs)

    def options(self, **options: Any) -> Any:
        return self._placed(**options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cls, name)


def main_modules() -> list[Any]:
    """verl's ``main_ppo`` as imported, and as ``__main__`` under ``python -m verl.trainer.main_ppo``."""
    found = []
    for mod in (sys.modules.get(MAIN_MODULE), sys.modules.get("__main__")):
        spec = getattr(mod, "__spec__", None)
        if mod is not None and (mod.__name__ == MAIN_MODULE or getattr(spec, "name", None) == MAIN_MODULE):
            if mod not in found:
                found.append(mod)
    return found


def pin_task_runner() -> int:
    """Wrap ``TaskRunnerV1`` in each loaded ``main_ppo`` (idempotent); returns how many were wrapped."""
    wrapped = 0
    for mod in main_modules():
        cls = getattr(mod, "TaskRunnerV1", None)
        if cls is not None and not isinstance(cls, OnDriverNode):
            mod.TaskRunnerV1 = OnDriverNode(cls)
            wrapped += 1
    return wrapped
