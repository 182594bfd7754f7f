"""The fault-tolerant Laminar runtime: rollouts, relays, pool, ledger and trainer that survive each other's death.

Dataflow (one asyncio loop in the driver; every component is its own process):
    queue of prompt groups -> policy.dispatch (whole group to one replica, one version) -> run_group
    run_group: pool.open per response -> EngineReplica.generate (streams chunks to the pool) -> all n done
               -> ledger.put_group (the experience buffer) -> pool.close -> finish_group -> next groups
    trainer process: ledger.lease -> step -> checkpoint -> ledger.commit -> publish to the master relay
    relay chain: master -> ... ; each replica refreshes from its own relay when its batch ended
    heartbeat loop: ping every replica; an actor error or ``dead_after_s`` of silence marks it dead
    failover (policy.failover.plan_failover): each orphaned group moves whole to a live replica of its
               version and its responses continue from the pool's tokens; no such replica -> a replacement
               replica loads that version from a relay; too old or version gone -> regenerated from the
               prompt with the newest weights (counted). A replacement keeps the fleet at its size.
    trainer watch: the trainer process died -> a new one loads the checkpoint, reconciles the ledger
               (leased-but-untrained groups go back) and republishes; rollouts never stop meanwhile
    relay group monitor: a dead relay is dropped and the chain rebuilt (a new master if needed)
Flow control: no new group is dispatched while more than ``max_ahead_groups`` groups wait to be trained.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Optional

from verl_laminar.buffer.experience import Trajectory as BufferTrajectory
from verl_laminar.ft.faults import FaultRecord
from verl_laminar.ft.recovery import FailoverMixin
from verl_laminar.policy.dispatch import (
    DispatchConfig,
    abandon_refresh,
    apply_plan,
    complete_refresh,
    finish_group,
    initial_state,
    plan_dispatch,
)
from verl_laminar.policy.failover import HeartbeatPolicy
from verl_laminar.policy.migration import Piece, Trajectory
from verl_laminar.rollout.badinput import GarbageOutputError, check_output_tokens

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RuntimeSettings:
    workdir: str
    model_dir: str
    replicas: int = 3
    n: int = 4
    groups_per_batch: int = 2
    groups_per_step: int = 2
    max_tokens: int = 96
    median: int = 24
    temperature: float = 1.0
    kv_mb: int = 4
    dtype: str = "float32"
    heartbeat: HeartbeatPolicy = HeartbeatPolicy(interval_s=1.0, dead_after_s=10.0)
    max_age_s: float = 120.0  # past this a group waiting for a replacement replica is regenerated instead
    pool: bool = True
    flush_tokens: int = 16
    flush_interval_s: float = 0.5
    max_ahead_groups: int = 8
    seed: int = 0
    namespace: str = "laminar_ft"

    def __post_init__(self) -> None:
        if self.replicas < 2:
            raise ValueError(f"replicas={self.replicas}: failover needs at least 2 rollout replicas")
        if self.max_ahead_groups < self.groups_per_step:
            raise ValueError(f"max_ahead_groups={self.max_ahead_groups} must be >= groups_per_step="
                             f"{self.groups_per_step}, or the trainer could never lease a full step")


def settings_from_laminar(laminar: Any, **kw: Any) -> RuntimeSettings:
    """RuntimeSettings whose pool and heartbeat come from the typed ``laminar`` config (config.schema)."""
    return RuntimeSettings(pool=laminar.pool.enabled, flush_tokens=laminar.pool.flush_tokens,
                           flush_interval_s=laminar.pool.flush_interval_s,
                           heartbeat=HeartbeatPolicy(laminar.heartbeat.interval_s, laminar.heartbeat.dead_after_s),
                           groups_per_batch=laminar.dispatch.groups_per_batch or RuntimeSettings.groups_per_batch,
                           **kw)


class Regenerate(Exception):
    """The group's version is gone: its responses restart from the prompt with the newest weights."""


def reward_of(token_ids: list[int]) -> float:
    """A rule-based reward the trainer can learn: the share of even token ids in the response."""
    return sum(1 for t in token_ids if t % 2 == 0) / max(1, len(token_ids))


def _vocab_size(model_dir: str) -> int:
    import json

    with open(os.path.join(model_dir, "config.json")) as f:
        return int(json.load(f)["vocab_size"])


class FtRuntime(FailoverMixin):
    def __init__(self, s: RuntimeSettings, workload: Any) -> None:
        self.s, self.work = s, workload
        self.cfg = DispatchConfig(s.groups_per_batch)
        self.replicas: dict[int, Any] = {}
        self.pids: dict[int, list[int]] = {}
        self.beats: dict[int, float] = {}
        self.state = initial_state(range(s.replicas), 0)
        self.queue: list[str] = []
        self.feed = list(workload.groups)
        self.feeding = True
        self.attempt: dict[str, int] = {}
        # set once a group's pool entries of its current attempt are open: a failover that moves the group while
        # run_group still awaits the opens must not reassign entries the pool has not seen yet
        self.pool_opened: dict[str, asyncio.Event] = {}
        self.started_s: dict[str, float] = {}
        self.trajectories_started = 0
        self.regenerated = 0
        self.resumed_from_pool = 0
        self.mixed_version = 0
        self.done_groups: set[str] = set()
        self.faults: list[FaultRecord] = []
        self.tasks: set[asyncio.Task] = set()
        self.error: Optional[BaseException] = None
        self.next_rid = s.replicas
        self.relay_group: Any = None
        self.relay_ids: list[str] = []
        self.pool: Any = None
        self.ledger: Any = None
        self.trainer: Any = None
        self.trainer_pid: Optional[int] = None
        self.trainer_restarts = 0
        self.newest: dict[int, int] = {}
        self._trained_n = 0
        self.garbage_outputs = 0
        self.vocab_size = _vocab_size(s.model_dir)
        self._failing: set[int] = set()
        self._stop = asyncio.Event()

    # ---------------------------------------------------------------- start / stop
    def _spawn(self, coro: Any) -> asyncio.Task:
        t = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(t)
        t.add_done_callback(self._reap)
        return t

    def _reap(self, t: asyncio.Task) -> None:
        self.tasks.discard(t)
        if not t.cancelled() and t.exception() is not None and self.error is None:
            logger.error("runtime task failed: %r", t.exception())
            self.error = t.exception()
            self._stop.set()

    def _relay_for(self, rid: int) -> str:
        return self.relay_ids[1 + rid % (len(self.relay_ids) - 1)]

    async def _start_replica(self, rid: int) -> Any:
        import ray

        from verl_laminar.pool.partial import ChunkPolicy
        from verl_laminar.rollout.engine_replica import EngineReplicaActor

        ncpu = os.cpu_count() or 1
        env = {"VLLM_CPU_OMP_THREADS_BIND": str(rid % ncpu), "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
        h = ray.remote(EngineReplicaActor).options(
            num_cpus=0, max_concurrency=1000, max_restarts=0, namespace=self.s.namespace,
            runtime_env={"env_vars": env}).remote(
            rid, self.s.model_dir, kv_cache_bytes=self.s.kv_mb << 20, max_num_seqs=64,
            max_model_len=self.s.max_tokens + 64, dtype=self.s.dtype, seed=self.s.seed + rid,
            pool_name=self._pool_name() if self.s.pool else None,
            chunk=ChunkPolicy(self.s.flush_tokens, self.s.flush_interval_s))
        await h.start.remote()
        self.pids[rid] = await h.pids.remote()
        self.beats[rid] = time.monotonic()
        return h

    def _pool_name(self) -> str:
        return f"{self.s.namespace}_pool"

    async def start(self) -> None:
        import ray

        from verl_laminar.buffer.ledger import TrainLedger
        from verl_laminar.pool.actor import spawn_pool
        from verl_laminar.relay.group import RelayGroup

        os.makedirs(self.s.workdir, exist_ok=True)
        node, ip = ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()
        group_name = f"{self.s.namespace}_relays"
        self.relay_group = ray.remote(RelayGroup).options(name=group_name, namespace=self.s.namespace,
                                                          max_concurrency=16, num_cpus=0).remote(
            group_name, namespace=self.s.namespace)
        self.relay_ids = [f"r{i}" for i in range(self.s.replicas + 1)]  # r0: the trainer's machine (master)
        await self.relay_group.spawn.remote({r: (node, ip) for r in self.relay_ids}, master="r0", chunks=8)
        await self.relay_group.start_monitor.remote()
        if self.s.pool:
            self.pool = spawn_pool(os.path.join(self.s.workdir, "pool.log"), name=self._pool_name())
        self.ledger = ray.remote(TrainLedger).options(name=f"{self.s.namespace}_ledger", namespace=self.s.namespace,
                                                      max_concurrency=8, num_cpus=0).remote()
        hs = await asyncio.gather(*(self._start_replica(i) for i in range(self.s.replicas)))
        self.replicas = dict(enumerate(hs))
        await self._start_trainer()

    def trainer_settings(self) -> Any:
        from verl_laminar.ft.trainer import TrainerSettings

        return TrainerSettings(model_dir=self.s.model_dir, ckpt_dir=os.path.join(self.s.workdir, "ckpt"),
                               ledger_name=f"{self.s.namespace}_ledger", relay_group=f"{self.s.namespace}_relays",
                               namespace=self.s.namespace, groups_per_step=self.s.groups_per_step)

    async def _start_trainer(self) -> dict:
        import ray

        from verl_laminar.ft.trainer import TrainerActor

        self.trainer = ray.remote(TrainerActor).options(num_cpus=0, max_restarts=0,
                                                        namespace=self.s.namespace).remote(self.trainer_settings())
        self.trainer_pid = await self.trainer.pid.remote()
        info = await self.trainer.recover.remote()
        self._trainer_run = self.trainer.run.remote()
        return info

    async def shutdown(self) -> None:
        import ray

        from verl_laminar.platform.procs import reap

        self._stop.set()
        for t in list(self.tasks):
            t.cancel()
        pids = [p for ps in self.pids.values() for p in ps[1:]]
        for h in list(self.replicas.values()):
            try:
                await asyncio.wait_for(h.shutdown.remote(), 10)
            except Exception:  # noqa: BLE001 - fault boundary: a dead replica cannot shut down
                pass
            ray.kill(h)
        reap(pids)  # vLLM engine processes of killed replicas, by PID
        if self.ledger is not None:
            await self.ledger.close.remote()
        for h in (self.trainer, self.ledger):
            if h is not None:
                ray.kill(h)
        if self.pool is not None:
            ray.kill(self.pool, no_restart=True)
        if self.relay_group is not None:
            try:
                await asyncio.wait_for(self.relay_group.shutdown.remote(), 30)
            except Exception:  # noqa: BLE001 - best effort; the relays are killed below anyway
                pass
            ray.kill(self.relay_group)

    # ---------------------------------------------------------------- dispatch
    def pump(self) -> None:
        if self._stop.is_set():
            return
        outstanding = len(self.started_s) - self._trained_n  # dispatched, not yet trained
        while self.feeding and self.feed and outstanding + len(self.queue) < self.s.max_ahead_groups:
            self.queue.append(self.feed.pop(0))
        plan = plan_dispatch(self.state, self.queue, self.newest, self.cfg)
        self.state = apply_plan(self.state, plan, self.cfg)
        self.queue = list(plan.waiting)
        for d in plan.refreshes:
            self._spawn(self._refresh(d.replica_id, d.to_version))
        for a in plan.assignments:
            self.started_s.setdefault(a.group_id, time.monotonic())
            self._spawn(self.run_group(a.group_id))

    async def _refresh(self, rid: int, version: int) -> None:
        from ray.exceptions import RayActorError

        try:
            await self.replicas[rid].load_from_relay.remote(version, f"{self.s.namespace}_relays",
                                                           self._relay_for(rid), self.s.namespace)
        except RayActorError:
            await self.replica_failed(rid, "died while loading weights")
            return
        except Exception as e:  # noqa: BLE001 - fault boundary: a failed load keeps the old version; retry
            logger.warning("replica %d: load of version %d failed (%r); it keeps serving its version", rid, version, e)
            if self.state.replica(rid).refreshing_to is not None:
                self.state = abandon_refresh(self.state, rid)
            await asyncio.sleep(1.0)
            self.pump()
            return
        if self.state.replica(rid).alive:
            self.state = complete_refresh(self.state, rid, version)
        self.pump()

    def _traj_key(self, gid: str, j: int) -> str:
        return f"{gid}_{j}"

    def _pool_key(self, gid: str, j: int) -> str:
        return f"{gid}_{j}@{self.attempt.get(gid, 0)}"

    async def run_group(self, gid: str) -> None:
        a = self.state.pins[gid]
        n = len(self.work.lengths[gid])
        self.trajectories_started += n
        sampling = {"temperature": self.s.temperature, "ignore_eos": True, "logprobs": True}
        if self.pool is not None:
            opened = self.pool_opened[self._pool_key(gid, 0)] = asyncio.Event()
            try:
                await asyncio.gather(*(self.pool.open.remote(self._pool_key(gid, j), gid, a.version,
                                                             self.work.prompts[gid], dict(sampling, max_tokens=L),
                                                             a.replica_id)
                                       for j, L in enumerate(self.work.lengths[gid])))
            finally:
                opened.set()  # also when an open failed: a waiting reassign then reports the missing entry
        # every response ends before the group is judged: on a regeneration all of them stop at _placed
        got = await asyncio.gather(*(self.run_traj(gid, j, a.version, sampling) for j in range(n)),
                                   return_exceptions=True)
        failed = [e for e in got if isinstance(e, BaseException)]
        if failed and not all(isinstance(e, Regenerate) for e in failed):
            raise next(e for e in failed if not isinstance(e, Regenerate))
        trajs = got
        if failed:
            await self._close_pool(gid, n)
            self.regenerated += n
            self.attempt[gid] = self.attempt.get(gid, 0) + 1
            self.queue.insert(0, gid)
            self.pump()
            return
        versions = {p.version for t in trajs for p in t.pieces}
        if len(versions) != 1:
            self.mixed_version += 1
            raise RuntimeError(f"group {gid} mixes versions {sorted(versions)}")
        now = time.time()
        batch = [BufferTrajectory(self._traj_key(gid, j), gid, n, trajs[j].version, now,
                                  {"prompt_ids": list(self.work.prompts[gid]), "token_ids": trajs[j].token_ids(),
                                   "log_probs": trajs[j].log_probs(), "reward": reward_of(trajs[j].token_ids())})
                 for j in range(n)]
        await self.ledger.put_group.remote(batch)
        await self._close_pool(gid, n)
        self.state, _ = finish_group(self.state, gid)
        self.done_groups.add(gid)
        self.pump()

    async def _close_pool(self, gid: str, n: int) -> None:
        if self.pool is not None:
            await asyncio.gather(*(self.pool.close.remote(self._pool_key(gid, j)) for j in range(n)))

    async def run_traj(self, gid: str, j: int, version: int, sampling: dict) -> Trajectory:
        from ray.exceptions import RayActorError

        key, L = self._traj_key(gid, j), self.work.lengths[gid][j]
        t = Trajectory(key, tuple(self.work.prompts[gid]), L, sampling)
        while not t.done:
            a = await self._placed(gid, version)
            prompt, params = t.next_request()
            try:
                out = await self.replicas[a.replica_id].generate.remote(
                    f"{key}@{self.attempt.get(gid, 0)}.{len(t.pieces)}.{a.replica_id}", prompt, params,
                    pool_key=self._pool_key(gid, j) if self.pool is not None else None, pool_offset=t.generated)
            except RayActorError:
                await self.replica_failed(a.replica_id, "a request failed: actor died")
                t = await self._resume(gid, j, version, sampling, t)
                continue
            try:
                check_output_tokens(out["token_ids"], out["log_probs"], self.vocab_size, key)
            except GarbageOutputError as e:
                # a replica that answers garbage is broken: fence it like a dead one; the pool keeps only
                # the tokens checked before this piece, and the trajectory continues elsewhere
                logger.error("%s", e)
                self.garbage_outputs += 1
                if self.pool is not None:
                    await self.pool.truncate.remote(self._pool_key(gid, j), t.generated)
                await self.replica_failed(a.replica_id, f"garbage output: {e}")
                t = await self._resume(gid, j, version, sampling, t)
                continue
            t.add(Piece(tuple(out["token_ids"]), tuple(out["log_probs"]), out["version"], out["replica_id"],
                        bool(out["finished"])))
        return t

    async def _placed(self, gid: str, version: int) -> Any:
        """Wait until the group is on a live replica of its version; Regenerate if failover gave it up."""
        while True:
            a = self.state.pins.get(gid)
            if a is None or a.version != version:
                raise Regenerate(gid)
            r = self.state.replica(a.replica_id)
            if r.alive and r.version == version and r.refreshing_to is None:
                return a
            await asyncio.sleep(0.05)

    async def _resume(self, gid: str, j: int, version: int, sampling: dict, old: Trajectory) -> Trajectory:
        """Continue from what the pool holds (the dead replica's unflushed tail is generated again)."""
        t = Trajectory(old.request_id, old.prompt_ids, old.max_tokens, sampling)
        if self.pool is not None:
            entry = await self.pool.get.remote(self._pool_key(gid, j))
            if entry.version != version:
                raise RuntimeError(f"pool entry {entry.key} has version {entry.version}, group pinned to {version}")
            if entry.early:
                # chunks of the dead stream held beyond a gap: the new stream continues from the last
                # contiguous token and must not be joined to them
                await self.pool.truncate.remote(self._pool_key(gid, j), len(entry.tokens))
            if entry.tokens:
                # all of it already made (only the reply was lost): the trajectory is complete
                t.add(Piece(tuple(entry.tokens), tuple(entry.logprobs), version, -1,
                            finished=len(entry.tokens) >= old.max_tokens))
                self.resumed_from_pool += 1
        return t

    async def version_loop(self) -> None:
        """What each replica's relay holds (its upstream's when it died): the newest a refresh may load."""
        import ray

        while not self._stop.is_set():
            try:
                plan = await self.relay_group.plan.remote()
                live = set(plan.relays)
                newest = {}
                for rid in self.replicas:
                    relay = self._relay_for(rid)
                    if relay not in live:
                        # the replica's load falls back to this relay's upstream: ask what that one holds
                        relay = (await self.relay_group.fallback_for.remote(relay))[0]
                    h = ray.get_actor(await self.relay_group.actor_name.remote(relay), namespace=self.s.namespace)
                    v = await asyncio.wait_for(h.newest.remote(), 2.0)
                    if v is not None:
                        newest[rid] = v
                self.newest = newest
                self._trained_n = (await self.ledger.stats.remote())["trained_groups"]
            except Exception as e:  # noqa: BLE001 - a relay dying between plan and query: next poll
                logger.debug("version poll failed: %r", e)
            self.pump()
            await asyncio.sleep(0.25)

    async def trainer_loop(self) -> None:
        from ray.exceptions import RayActorError

        while not self._stop.is_set():
            try:
                await self._trainer_run
                return
            except RayActorError:
                fault = next((f for f in reversed(self.faults) if f.kind == "trainer" and f.t_recovered is None), None)
                if fault is not None:
                    fault.t_detect = time.time()
                logger.warning("trainer process died; restarting it from its checkpoint")
                self.trainer_restarts += 1
                info = await self._start_trainer()
                if fault is not None:
                    fault.t_recovered = time.time()
                    fault.detail.update(info)

    async def run(self, until: Any) -> None:
        """Run until ``until(self)`` says feeding is over, then drain: every started group trained."""
        self.pump()
        for loop in (self.heartbeat_loop(), self.version_loop(), self.trainer_loop()):
            self._spawn(loop)
        while not self._stop.is_set():
            if self.feeding and await until(self):
                self.feeding = False
                logger.info("feeding stopped; draining %d groups", len(self.started_s) - self._trained_n)
            if not self.feeding and self._trained_n >= len(self.started_s) and not self.queue:
                break
            await asyncio.sleep(0.25)
        if self.error is not None:
            raise self.error
