"""The partial-response pool on verl's trainer path (``laminar.pool.enabled``): the pool actor and the replicas
that stream to it.

    LaminarTrainer._setup: spawn_partial_pool (laminar.pool.shards actors, each with a fresh log in the driver's
        node's temp dir or laminar.pool.log_dir, on the driver's node, after sweeping a pool a crashed run left
        behind) -> with streaming_replicas(...): verl's _setup builds its rollout replicas as
        rollout.streaming_server.LaminarVLLMReplica
    pinned clients open / close an entry per request piece and read it when the replica dies
        (rollout.pool_client); the router counts continuations; the trainer reports laminar/ft/pool_*
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, Iterator, Optional

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("LAMINAR_LOGGING_LEVEL", "INFO"))  # part of the run's record, as the trainer's lines

POOL_LOG = "laminar_pool.log"


def pool_log_path(config: Any, log_dir: Optional[str] = None) -> str:
    """Where the pool's log goes: ``laminar.pool.log_dir``, or by default this node's temp dir (node-local disk:
    the log takes a write per batch of chunks, which shared storage, where ``trainer.default_local_dir`` usually
    lives on a cluster, would serve at a network round trip each), in a folder named after the run's
    ``default_local_dir`` so that two runs on one machine never share a log."""
    if log_dir:
        return os.path.join(str(log_dir), POOL_LOG)
    import hashlib
    import tempfile

    run = os.path.abspath(str(config.trainer.default_local_dir))
    tag = hashlib.sha256(run.encode()).hexdigest()[:12]
    return os.path.join(tempfile.gettempdir(), f"laminar_pool_{tag}", POOL_LOG)


def chunk_policy(pool: Any) -> Any:
    """The rollouts' ``pool.partial.ChunkPolicy`` from the typed ``laminar.pool`` section."""
    from verl_laminar.pool.partial import ChunkPolicy

    return ChunkPolicy(pool.flush_tokens, pool.flush_interval_s, pool.batch_tick_s)


def shard_count(config: Any, laminar: Any) -> int:
    """``laminar.pool.shards``, or with null as many as the fleet's running sequences need (``pool.shards``: rollout
    GPUs / a replica's GPUs x ``rollout.max_num_seqs``, at most two steps' trajectories)."""
    if laminar.pool.shards is not None:
        return int(laminar.pool.shards)
    from omegaconf import OmegaConf

    from verl_laminar.pool.shards import running_bound, shards_for

    def get(key: str, default: Any) -> Any:
        value = OmegaConf.select(config, key, default=default)
        return default if value is None else value

    ro = "actor_rollout_ref.rollout"
    if int(get(f"{ro}.nnodes", 0)) > 0:  # the rollout's own machines
        gpus = int(get(f"{ro}.nnodes", 1)) * int(get(f"{ro}.n_gpus_per_node", 1))
    else:
        gpus = int(get("trainer.nnodes", 1)) * int(get("trainer.n_gpus_per_node", 1))
    per_replica = max(1, int(get(f"{ro}.tensor_model_parallel_size", 1)) * int(get(f"{ro}.data_parallel_size", 1))
                      * int(get(f"{ro}.pipeline_model_parallel_size", 1)))
    step = int(get("data.train_batch_size", 0)) * int(get(f"{ro}.n", 1))
    return shards_for(running_bound(gpus // per_replica, int(get(f"{ro}.max_num_seqs", 1024)), step or None))


def spawn_partial_pool(config: Any, laminar: Any) -> Optional[Any]:
    """The pool's shards of this run (``pool.shards.PoolShards``), or None with ``laminar.pool.enabled=false``.

    The logs start empty: their entries belong to request pieces of an earlier process, which no client will read
    again (the clients that opened them are gone, and a resumed run regenerates what was not trained)."""
    if not laminar.pool.enabled:
        return None
    import ray

    from verl_laminar.pool.actor import POOL_NAME
    from verl_laminar.pool.shards import find_shards, shard_log, spawn_shards

    detached = laminar.fleet.detached
    try:  # a crashed run's pool in a Ray cluster that outlived it
        left = find_shards()
    except ValueError:
        left = None  # none: the usual case
    if left is not None and detached and resuming(config):
        # a detached fleet's pool: what its replicas finished while the trainer was down is adopted from it
        logger.warning("laminar: resuming with the partial-response pool %r the previous trainer left (%d shard(s), "
                       "%d entries)", POOL_NAME, len(left), left.size())
        return left
    if left is not None:
        for h in left.handles:
            ray.kill(h)
        logger.warning("laminar: killed a partial-response pool (%d shards) left by an earlier run", len(left))
    n = shard_count(config, laminar)
    path = pool_log_path(config, laminar.pool.log_dir)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    paths = [shard_log(path, i) for i in range(n)]
    for p in paths:
        if os.path.exists(p):
            os.remove(p)
    pool = spawn_shards(paths, node_id=ray.get_runtime_context().get_node_id(), detached=detached)
    # started (each replays nothing): a failure shows here, not at the first request
    ray.get([h.__ray_ready__.remote() for h in pool.handles])
    logger.info("laminar: partial-response pool %r of %d shard(s) on this node, logs %s (flush every %d tokens or "
                "%.1f s)", POOL_NAME, n, ", ".join(paths), laminar.pool.flush_tokens, laminar.pool.flush_interval_s)
    return pool


def resuming(config: Any) -> bool:
    """Whether verl will resume this run from a checkpoint (``trainer.resume_mode`` and a saved step)."""
    if str(config.trainer.resume_mode) == "disable":
        return False
    path = str(config.trainer.resume_from_path or "") if str(config.trainer.resume_mode) == "resume_path" else ""
    return bool(path) or os.path.exists(os.path.join(str(config.trainer.default_local_dir),
                                                     "latest_checkpointed_iteration.txt"))


@contextlib.contextmanager
def streaming_replicas(laminar: Any, rollout_name: str) -> Iterator[bool]:
    """Inside, verl's ``LLMServerManager`` builds its vLLM replicas with the streaming server (its
    ``rollout_replica_class`` seam); yields whether it does. Off for other engines or with the pool off."""
    from verl.workers.rollout.llm_server import LLMServerManager

    if not laminar.pool.enabled or rollout_name != "vllm":
        if laminar.pool.enabled:
            logger.warning("laminar.pool.enabled: rollout %r has no streaming server; a dead replica's requests "
                           "restart from the prompt", rollout_name)
        yield False
        return
    from verl_laminar.rollout.streaming_server import replica_class_for

    if "rollout_replica_class" in vars(LLMServerManager):
        raise RuntimeError("verl's LLMServerManager.rollout_replica_class is already set; the partial-response pool "
                           "needs its own replica class there (laminar.pool.enabled=false to run without it)")
    LLMServerManager.rollout_replica_class = replica_class_for(
        chunk_policy(laminar.pool), detached=laminar.fleet.detached)
    try:
        yield True
    finally:
        del LLMServerManager.rollout_replica_class
