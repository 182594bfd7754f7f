"""verl's helper actors off rollout machines (``laminar.helpers``).

verl 0.9.1 places its helpers round-robin over every alive node: TransferQueue storage units with a hard affinity
(``transfer_queue.utils.common.get_node_round_robin_scheduling_strategies``), agent-loop workers
(``AgentLoopManager._init_agent_loop_workers``) and reward workers (``RewardLoopManager._init_reward_loop_workers``)
with a soft one. On a cluster some land on rollout machines, and the loss of such a machine crashes or stalls the
run before any of Laminar's recovery runs (a storage unit holds batch data; an agent-loop worker holds requests).

Under ``laminar.helpers=task_runner`` (the default) all of them start with a soft affinity to the node of verl's
TaskRunner: the process that builds them, where the trainer's loop, the rollout router and the partial-response
pool run (``patches/task_runner.py`` starts it on the driver's node when that has room). A machine that holds them
is then one whose loss the run cannot survive anyway. ``spread`` keeps verl's placement.

Dataflow: ``LaminarTaskRunner.run`` (``patches/task_runner.py``) enters ``helpers_placed(config)`` around verl's
``run``; inside, TransferQueue's node choice and verl's ``RewardLoopManager`` are this module's; the agent-loop
manager is Laminar's own class (``rollout/agent_loop.py``), which asks ``on_task_runner`` itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, Iterator

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("LAMINAR_LOGGING_LEVEL", "INFO"))  # where the helpers went belongs in the run's record

MODES = ("task_runner", "spread")


def mode_of(config: Any) -> str:
    """``laminar.helpers`` of a verl config (``task_runner`` where the key is absent: the schema's default)."""
    from omegaconf import OmegaConf

    mode = OmegaConf.select(config, "laminar.helpers", default="task_runner")
    if mode not in MODES:
        raise ValueError(f"laminar.helpers={mode!r}: must be one of {', '.join(MODES)}")
    return str(mode)


def on_task_runner(config: Any) -> bool:
    """Whether this Laminar run starts verl's helpers on the TaskRunner's node."""
    return is_laminar(config) and mode_of(config) == "task_runner"


def is_laminar(config: Any) -> bool:
    from omegaconf import OmegaConf

    return OmegaConf.select(config, "trainer.v1.trainer_mode", default=None) == "laminar"


def here(soft: bool = True) -> Any:
    """An affinity to this process's node; ``soft``: elsewhere when this node has no room (a 0-CPU actor needs a
    hard one: on 3 emulated machines Ray placed the router on a rollout machine in spite of a soft affinity)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=soft)


def storage_strategies(original: Any) -> Any:
    """TransferQueue's node choice, with every storage unit on this node unless the user named a node resource
    (``transfer_queue.backend.SimpleStorage.required_node_resource`` is the user's own placement: kept)."""

    def strategies(num_actors: int, required_node_resource: Any = None) -> list:
        if required_node_resource is not None:
            return original(num_actors, required_node_resource=required_node_resource)
        return [here() for _ in range(num_actors)]

    return strategies


def reward_manager_class(base: Any = None) -> type:
    """verl's ``RewardLoopManager`` (or ``base``, what verl's trainer module holds) with its workers started on
    this node."""
    if base is None:
        from verl.experimental.reward_loop.reward_loop import RewardLoopManager as base

    class LaminarRewardLoopManager(base):
        def _init_reward_loop_workers(self) -> None:
            strategy = here()
            self.reward_loop_workers = [
                self.reward_loop_workers_class.options(name=f"reward_loop_worker_{rank}",
                                                       scheduling_strategy=strategy)
                .remote(self.config, self.reward_router_address)
                for rank in range(int(self.config.reward.num_workers))]

    return LaminarRewardLoopManager


@contextlib.contextmanager
def helpers_placed(config: Any) -> Iterator[bool]:
    """Within: verl's TransferQueue storage units and reward workers start on this node (``on_task_runner``).
    Yields whether it placed them."""
    if not on_task_runner(config):
        yield False
        return
    import ray
    from transfer_queue.storage.bootstrap import simple_storage_bootstrap as tq_boot
    from verl.trainer.ppo.v1 import trainer_base

    saved = (tq_boot.get_node_round_robin_scheduling_strategies, trainer_base.RewardLoopManager)
    tq_boot.get_node_round_robin_scheduling_strategies = storage_strategies(saved[0])
    trainer_base.RewardLoopManager = reward_manager_class(saved[1])
    logger.info("laminar: verl's helpers (TransferQueue storage units, agent-loop and reward workers) start on the "
                "TaskRunner's node %s (laminar.helpers=task_runner)", ray.get_runtime_context().get_node_id())
    try:
        yield True
    finally:
        tq_boot.get_node_round_robin_scheduling_strategies, trainer_base.RewardLoopManager = saved


def placement_report(actors: dict[str, list], node: str) -> dict:
    """Pure: ``{kind: [node id, ...]}`` against the TaskRunner's ``node`` -> counts, and the kinds with an actor
    elsewhere (what the run logs after start-up: where the helpers really are, not where they were asked to be)."""
    counts = {kind: sum(n == node for n in nodes) for kind, nodes in actors.items()}
    away = {kind: sorted({n for n in nodes if n != node}) for kind, nodes in actors.items()}
    return {"node": node, "on_node": counts, "total": {k: len(v) for k, v in actors.items()},
            "elsewhere": {k: v for k, v in away.items() if v}}
