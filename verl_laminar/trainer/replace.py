"""Replacement replicas under verl's trainer (``laminar.replace``): the Ray and verl side of
``fleet.replacement.ReplacementLoop``.

    release(dead):  end what is left of it (a replica fenced for garbage output still runs), then remove its
                    placement group: on a cluster whose
                    devices are all taken, the new replica can only be placed where the dead one was
    launch(new):    the replica class verl built the fleet with (the streaming server with the pool on), rank
                    ``new``, verl's own ``init_standalone`` (its resource pool, CheckpointEngineWorkers, server)
    join(handles, dead):  the hang watch tracks it, it runs at the rollouts' CPU priority, the router adds it with its
                    node's relay
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any, Callable, Optional

from verl_laminar.fleet.replacement import ReplacementLoop

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("LAMINAR_LOGGING_LEVEL", "INFO"))
RELEASE_WAIT_S = 30.0  # the most a release waits for Ray to take back a placement group


def release_replica(replica: Any) -> None:
    """Free a dead verl replica's actors and placement group (what is already gone is skipped)."""
    import ray

    for actor in (*getattr(replica, "servers", ()), *getattr(replica, "workers", ())):
        try:
            ray.kill(actor, no_restart=True)
        except Exception as e:  # noqa: BLE001 - already dead: the usual case
            logger.debug("laminar: release of replica %s: ray.kill: %r", replica.replica_rank, e)
    pool = getattr(replica, "resource_pool", None)
    for pg in list(getattr(pool, "pgs", None) or ()):
        try:
            ray.util.remove_placement_group(pg)
        except Exception as e:  # noqa: BLE001 - removed already
            logger.debug("laminar: release of replica %s: placement group: %r", replica.replica_rank, e)
            continue
        # removal is asynchronous; the new replica's placement needs the devices back
        deadline = time.monotonic() + RELEASE_WAIT_S
        while time.monotonic() < deadline:
            if (ray.util.placement_group_table(pg) or {}).get("state") == "REMOVED":
                break
            time.sleep(0.1)


def launch_replica(template: Any, rank: int, timeout_s: float) -> Any:
    """A new replica like ``template`` (one of verl's), started standalone with ``rank``; raises after
    ``timeout_s``."""
    cls = type(template)
    deadline = time.monotonic() + timeout_s
    while True:
        replica = cls(replica_rank=int(rank), config=template.config, model_config=template.model_config,
                      gpus_per_node=template.gpus_per_node)
        try:
            asyncio.run(asyncio.wait_for(replica.init_standalone(), max(1.0, deadline - time.monotonic())))
            return replica
        except ValueError as e:
            # verl checks the cluster's free devices before it places anything: the released placement group's
            # devices may not be counted free yet
            if "available GPUs" not in str(e) or time.monotonic() + 1.0 > deadline:
                raise
            logger.info("laminar: replacement %d waits for devices: %s", rank, e)
            time.sleep(1.0)
        except BaseException:
            release_replica(replica)  # what started of it: no half-built replica holds devices
            raise


def start_replacement(laminar: Any, verl_replicas: list, router: Any, relay_group: Any,
                      on_join: Callable[[Any], None], killer: Any) -> Optional[ReplacementLoop]:
    """The running loop, or None with ``laminar.replace.enabled=false``. ``verl_replicas``: verl's replica objects
    (this list grows with each replacement); ``on_join(handles)``: the trainer's own bookkeeping (the killer,
    CPU priority, the handles it keeps), before the router gives the replica work; ``killer``
    (``trainer.hang.ReplicaKiller``) ends what runs of a dead replica: a fenced one (garbage output) is alive."""
    cfg = laminar.replace
    if not cfg.enabled:
        logger.info("laminar.replace.enabled=false: a dead replica is not replaced")
        return None
    import ray

    from verl_laminar.trainer import relays

    by_rank = {int(r.replica_rank): r for r in verl_replicas}
    template = verl_replicas[0]

    def dead() -> list[int]:
        return ray.get(router.dead_replicas.remote())

    def known() -> list[int]:
        return list(by_rank)

    def release(rid: int) -> None:
        killer.kill(rid, "laminar: release of dead replica")  # SIGKILLed ones: nothing left; fenced ones: all
        release_replica(by_rank[rid])

    def launch(rank: int) -> Any:
        replica = launch_replica(template, rank, cfg.start_timeout_s)
        by_rank[rank] = replica
        verl_replicas.append(replica)
        return relays.replica_handles([replica])[0]

    def join(handles: Any, dead_id: int) -> None:
        on_join(handles)
        relay = relays.replica_relays(relay_group, [handles])[handles.replica_id]
        ray.get(router.add_replica.remote(handles, relay, replaces=dead_id))

    def failed(dead_id: int, error: str) -> None:
        ray.get(router.replacement_failed.remote(dead_id, error))

    loop = ReplacementLoop(dead, known, release, launch, join, failed, limit=cfg.max_replacements,
                           interval_s=laminar.heartbeat.interval_s)
    logger.info("laminar: replacement on (a dead replica is replaced by a new one, at most %d in this run, each "
                "started within %.0f s)", cfg.max_replacements, cfg.start_timeout_s)
    return loop.start()
