"""Rollouts that outlive the trainer (``laminar.fleet.detached``): detached replicas, their manifest, and the sweep.

Ray actors die with their owner, and verl's ``TaskRunner`` owns every rollout replica. With a detached fleet the
replica's placement group, its ``CheckpointEngineWorker``s and its vLLM server are detached Ray actors instead
(``detached_standalone``), recorded in a detached, named manifest actor in the job's fixed namespace, and the
partial-response pool is detached too. Dataflow around a trainer kill:

    trainer alive   beats the manifest every heartbeat interval (``Heartbeat``)
    trainer killed  the replicas' requests in flight run to their end (an actor call outlives its caller); each
                    streams its tokens to the pool, which marks whole responses finished
    same command, trainer.resume_mode=auto
                    ``check_cluster``: a cluster from ``ray start`` and a fixed namespace, else an error saying so
                    ``sweep``: wait (laminar.fleet.drain_timeout_s) until the recorded servers hold no request,
                    count the tokens that reached the pool after the last beat (generated while the trainer was
                    down), then end the recorded servers, workers and placement groups (their names are taken by
                    the new replicas) -> verl builds new replicas; verl re-issues the checkpoint's running prompts,
                    and the agent-loop workers adopt the groups the pool holds whole (``policy.adopt``)
    clean end       ``sweep`` with no wait: nothing detached is left in the cluster
The relays, the router and the agent-loop workers stay the trainer's: a restart builds them anew (the router's
state is rebuilt from the replicas' versions, the relays from the checkpoint's weights).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from typing import Any, Optional

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("LAMINAR_LOGGING_LEVEL", "INFO"))

MANIFEST_NAME = "laminar_fleet_manifest"


class FleetManifest:
    """What a detached fleet holds (per replica rank: its servers, workers and placement groups) and when its
    trainer last beat. Plain class; ``open_manifest`` runs it as a detached, named Ray actor."""

    def __init__(self) -> None:
        self._replicas: dict[int, dict] = {}
        self._beat: Optional[float] = None

    def record(self, rank: int, servers: list, workers: list, pgs: list) -> None:
        self._replicas[int(rank)] = {"servers": list(servers), "workers": list(workers), "pgs": list(pgs)}

    def beat(self, t: float) -> None:
        self._beat = float(t)

    def contents(self) -> dict:
        return {"replicas": dict(self._replicas), "beat": self._beat}

    def clear(self) -> None:
        self._replicas.clear()


def open_manifest() -> Any:
    import ray

    from verl_laminar.fleet.helpers import here

    return ray.remote(FleetManifest).options(name=MANIFEST_NAME, lifetime="detached", get_if_exists=True,
                                             num_cpus=0, scheduling_strategy=here(soft=False)).remote()


def check_cluster(config: Any) -> None:
    """A detached fleet needs a cluster that outlives the job and a namespace a relaunch finds it in; raises
    ``policy.attach.FleetAttachError`` saying which to set."""
    import ray
    from omegaconf import OmegaConf
    from ray._private.utils import read_ray_address

    from verl_laminar.policy.attach import require_outliving_cluster

    # `ray start` writes its address to a file on its host; a cluster a driver's own ray.init started does not
    started = read_ray_address()
    gcs = ray.get_runtime_context().gcs_address
    require_outliving_cluster(cluster_outlives_job=bool(started) and started == gcs,
                              stable_namespace=OmegaConf.select(config, "ray_kwargs.ray_init.namespace") is not None)


class _DetachedServerClass:
    """verl's ``launch_servers`` creates the server through ``server_class.options(...)``: the same call, detached."""

    def __init__(self, actor_class: Any) -> None:
        self._actor_class = actor_class

    def options(self, **kwargs: Any) -> Any:
        return self._actor_class.options(lifetime="detached", **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._actor_class, name)


def detach_server_class(actor_class: Any) -> Any:
    return _DetachedServerClass(actor_class)


async def detached_standalone(replica: Any) -> None:
    """verl's ``RolloutReplica.init_standalone`` for a rollout replica, with its placement group and workers
    detached (verl's ``RayResourcePool`` and ``RayWorkerGroup`` take ``detached``), then recorded in the manifest.
    The server is detached by its class (``detach_server_class``)."""
    from verl.single_controller.ray.base import RayResourcePool, RayWorkerGroup
    from verl.utils.device import get_device_name
    from verl.workers.rollout.replica import RolloutMode

    replica.rollout_mode = RolloutMode.STANDALONE
    rank, suffix = replica.replica_rank, replica.name_suffix
    replica.resource_pool = RayResourcePool(process_on_nodes=[replica.gpus_per_replica_node] * replica.nnodes,
                                            use_gpu=True, max_colocate_count=2,
                                            name_prefix=f"rollout_pool_{rank}{suffix}", detached=True)
    group = RayWorkerGroup(resource_pool=replica.resource_pool, ray_cls_with_init=replica.get_ray_class_with_init_args(),
                           bin_pack=False, name_prefix=f"rollout_standalone_{rank}{suffix}", use_gpu=True,
                           device_name=get_device_name(), detached=True)
    replica.workers = group.workers
    await replica.launch_servers()
    manifest = open_manifest()
    await manifest.record.remote(rank, list(replica.servers), list(replica.workers),
                                 list(replica.resource_pool.get_placement_groups()))


class Heartbeat:
    """The trainer's beat in the manifest, from a daemon thread: the last one bounds when a killed trainer died."""

    def __init__(self, manifest: Any, interval_s: float) -> None:
        self._manifest, self._interval_s = manifest, float(interval_s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="laminar-fleet-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import ray

        while not self._stop.is_set():
            try:
                ray.get(self._manifest.beat.remote(time.time()), timeout=max(5.0, 5 * self._interval_s))
            except Exception as e:  # a missed beat only makes the bound looser; the run goes on
                logger.warning("laminar.fleet: heartbeat to the manifest failed: %r", e)
            self._stop.wait(self._interval_s)

    def stop(self) -> None:
        self._stop.set()


async def _unfinished(server: Any) -> int:
    import ray

    try:
        return int(await asyncio.wait_for(server.laminar_unfinished.remote(), 10.0))
    except (ray.exceptions.RayActorError, asyncio.TimeoutError):
        return 0  # dead or hung: it finishes nothing more


async def _answers(servers: list) -> bool:
    import ray

    try:
        await asyncio.wait_for(asyncio.gather(*(s.__ray_ready__.remote() for s in servers)), 10.0)
        return bool(servers)
    except (ray.exceptions.RayActorError, asyncio.TimeoutError):
        return False


async def _alive(replicas: list) -> int:
    """How many of the recorded replicas still answer (the record keeps dead ones that were replaced)."""
    return sum(await asyncio.gather(*(_answers(r["servers"]) for r in replicas)))


async def _drain(servers: list, timeout_s: float) -> tuple[int, float]:
    """Wait until no server holds a request (or the timeout); returns (requests left, seconds waited)."""
    t0 = time.monotonic()
    while True:
        left = sum(await asyncio.gather(*(_unfinished(s) for s in servers)))
        if left == 0 or time.monotonic() - t0 >= timeout_s:
            return left, time.monotonic() - t0
        await asyncio.sleep(0.5)


def _wait_dead(actors: list, timeout_s: float = 60.0) -> None:
    """Until every killed actor is gone: its name is free for the new replica of the same rank only then."""
    import ray

    deadline = time.monotonic() + timeout_s
    for actor in actors:
        while time.monotonic() < deadline:
            try:
                ray.get(actor.__ray_ready__.remote(), timeout=5.0)
            except ray.exceptions.RayActorError:
                break
            except ray.exceptions.GetTimeoutError:
                pass
            time.sleep(0.2)


def sweep(drain_timeout_s: float, pool: Any = None, ending: bool = False) -> dict:
    """End a detached fleet a predecessor left (after letting its servers finish, up to ``drain_timeout_s``).
    Returns what it found: replicas, requests still unfinished at the end, seconds waited, the last beat and the
    tokens that reached ``pool`` after it."""
    import ray

    try:
        manifest = ray.get_actor(MANIFEST_NAME)
    except ValueError:
        return {"replicas": 0}
    found = ray.get(manifest.contents.remote())
    replicas = found["replicas"]
    servers = [s for r in replicas.values() for s in r["servers"]]
    alive = asyncio.run(_alive(list(replicas.values()))) if replicas else 0
    left, waited = asyncio.run(_drain(servers, drain_timeout_s)) if servers and drain_timeout_s > 0 else (0, 0.0)
    beat = found["beat"]
    tokens = pool.tokens_since(beat) if pool is not None and beat is not None and replicas else 0
    for r in replicas.values():  # a replica that died and was replaced meanwhile is gone already: skipped
        for actor in [*r["servers"], *r["workers"]]:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        for pg in r["pgs"]:
            with contextlib.suppress(Exception):
                ray.util.remove_placement_group(pg)
    ray.get(manifest.clear.remote())
    _wait_dead([a for r in replicas.values() for a in [*r["servers"], *r["workers"]]])
    if replicas and ending:
        logger.info("laminar.fleet: ended the %d detached replicas at the run's end (%d recorded, the rest died "
                    "before)", alive, len(replicas))
    elif replicas:
        logger.warning("laminar.fleet: ended the %d live detached replicas a previous trainer left (of %d recorded; "
                       "%d requests still running after %.1f s); %d tokens reached the pool after its last heartbeat",
                       alive, len(replicas), left, waited, tokens)
    return {"replicas": len(replicas), "alive": alive, "unfinished": left, "drained_s": waited, "beat": beat,
            "tokens_while_down": tokens}


def end_manifest() -> None:
    import ray

    try:
        ray.kill(ray.get_actor(MANIFEST_NAME))
    except ValueError:
        pass
