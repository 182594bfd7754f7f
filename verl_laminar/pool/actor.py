"""The partial-response pool as a Ray actor: ``PartialPool`` behind a named, restartable, CPU-only actor.

Ray restarts the actor when its process dies (``max_restarts=-1``); the constructor replays the pool's log,
so a restarted pool holds every chunk that was acknowledged before the crash. Calls made while it restarts
are retried by Ray (``max_task_retries``) instead of failing the rollout.
"""

from __future__ import annotations

import gc
import time
from typing import Any, Optional

from verl_laminar.pool.partial import PartialPool

POOL_NAME = "laminar_partial_pool"
FREEZE_EVERY_S = 5.0


class PoolProcess(PartialPool):
    """The pool in a process of its own. Its entries' token and log-prob lists (up to 16K values each, ~10^8 at the
    paper's scale) are containers the garbage collector's full passes walk element by element: a pass paused the
    pool for 0.3 s on 16K entries, longer than a chunk's whole budget. Nothing in the pool forms reference cycles
    (its entries are freed by reference counting when they close), so every few seconds what lives is moved out of
    the collector's view (``gc.freeze``); new objects are still collected, and frozen ones still freed when their
    last reference goes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        gc.freeze()  # the replayed log
        self._frozen_at = time.monotonic()

    def apply_many(self, ops: list[tuple[str, tuple]]) -> list[Any]:
        out = super().apply_many(ops)
        if time.monotonic() - self._frozen_at > FREEZE_EVERY_S:
            gc.freeze()
            self._frozen_at = time.monotonic()
        return out

    def stats(self) -> dict:
        return {**super().stats(), "gc_frozen": gc.get_freeze_count()}


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
    return ray.remote(PoolProcess).options(**options).remote(log_path)
