"""The partial-response pool as a Ray actor: ``PartialPool`` behind a named, restartable, CPU-only actor.

Ray restarts the actor when its process dies (``max_restarts=-1``); the constructor replays the pool's log,
so a restarted pool holds every chunk that was acknowledged before the crash. Calls made while it restarts
are retried by Ray (``max_task_retries``) instead of failing the rollout.
"""

from __future__ import annotations

from typing import Any, Optional

from verl_laminar.pool.partial import PartialPool

POOL_NAME = "laminar_partial_pool"


def spawn_pool(log_path: str, name: str = POOL_NAME, node_id: Optional[str] = None, detached: bool = False) -> Any:
    """``detached``: the pool outlives the job that made it (``laminar.fleet.detached``)."""
    import ray

    options: dict[str, Any] = dict(name=name, num_cpus=0, max_restarts=-1, max_task_retries=-1)
    if detached:
        options["lifetime"] = "detached"
    if node_id is not None:
        # the log is on this node's disk: a restart must come back on the same machine
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
    return ray.remote(PartialPool).options(**options).remote(log_path)
