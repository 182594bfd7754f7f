"""Load one weight version into one rollout replica, without touching any other replica.

verl has no call for this (its ``CheckpointEngineManager.update_weights`` aborts and syncs every replica);
its pieces do: each ``CheckpointEngineWorker.update_weights(global_steps)`` of the replica reads the version
from this machine's relay and pushes it into the vLLM engine, then labels the server with ``global_steps``.
The router calls this only for an idle replica (its batch ended, nothing in flight), so no abort/resume.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Sequence

logger = logging.getLogger(__name__)


async def refresh_replica(workers: Sequence[Any], version: int) -> None:
    """Pull ``version`` into every worker of one replica (``ONE_TO_ALL``, as verl's worker group would).

    The version is always explicit: with ``None`` the relay serves its newest but vLLM keeps its old
    ``global_steps`` label, and every later trajectory would be mislabelled.
    """
    if version is None or int(version) < 0:
        raise ValueError(f"refresh_replica needs an explicit version >= 0, got {version!r}")
    if not workers:
        raise ValueError("refresh_replica: the replica has no CheckpointEngineWorker handles")
    await asyncio.gather(*[w.update_weights.remote(global_steps=int(version)) for w in workers])
