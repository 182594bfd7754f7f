"""Where verl's helpers and Laminar's control actors really are, read once at the start of training (the placement
itself: ``fleet.helpers``)."""

from __future__ import annotations

import logging
import os
from typing import Any, Optional

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("LAMINAR_LOGGING_LEVEL", "INFO"))  # where the helpers went belongs in the run's record


def helper_actors(config: Any, agent_loop_manager: Any, reward_loop_manager: Any) -> dict[str, list]:
    """verl's helper actors of this run by kind (storage units by their names in TransferQueue)."""
    import ray
    from omegaconf import OmegaConf

    units = int(OmegaConf.select(config, "transfer_queue.backend.SimpleStorage.num_data_storage_units", default=0))
    storage = []
    for rank in range(units):
        try:
            storage.append(ray.get_actor(f"TransferQueueStorageUnit#{rank}"))
        except ValueError:  # another storage backend, or not named as verl 0.9.1 names it
            break
    return {"storage": storage, "agent_loop": list(getattr(agent_loop_manager, "agent_loop_workers", None) or []),
            "reward": list(getattr(reward_loop_manager, "reward_loop_workers", None) or [])}


def check_placement(config: Any, agent_loop_manager: Any, reward_loop_manager: Any,
                    laminar_actors: Optional[dict[str, Any]] = None) -> dict:
    """Where verl's helpers (and ``laminar_actors``: Laminar's router and relay group, always started here) really
    are, logged once at the start of training (one placed away from the TaskRunner under ``task_runner`` is a
    warning: that node had no room, and its loss may stop the run)."""
    import ray

    from verl_laminar.fleet.helpers import mode_of, on_task_runner, placement_report
    from verl_laminar.trainer.procs import node_of

    node = ray.get_runtime_context().get_node_id()
    actors = helper_actors(config, agent_loop_manager, reward_loop_manager)
    actors.update({k: [v] for k, v in (laminar_actors or {}).items()})
    report = placement_report({k: [node_of(a) for a in v] for k, v in actors.items()}, node)
    text = ", ".join(f"{k} {report['on_node'][k]}/{report['total'][k]}" for k in actors)
    if on_task_runner(config) and report["elsewhere"]:
        logger.warning("laminar: verl's helpers on the TaskRunner's node %s: %s; elsewhere: %s (that node had no "
                       "room; a machine holding one may not be lost)", node[:12], text, report["elsewhere"])
    else:
        logger.info("laminar: verl's helpers on the TaskRunner's node %s: %s (laminar.helpers=%s)", node[:12], text,
                    mode_of(config))
    return report
