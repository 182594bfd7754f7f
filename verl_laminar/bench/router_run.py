"""One generation run of ``bench.repack``: Laminar's router over bench engines, fed a fixed workload.

The decisions are the product's: ``rollout.router.LaminarRouter`` (the loop that runs in the router actor under
``+laminar=enabled``) runs here in this process's event loop and decides which replica takes each prompt group,
when a replica refreshes (only when its own batch ended), and which tails repack moves. The engines
(``rollout.engine_replica``) stand in for verl's vLLM servers through the router's seams:

- the refresher loads a version's bytes into an engine (``load_weights``), where verl's replica pulls from its relay;
- the reader returns an engine's KV-cache reading, where the router reads a vLLM server's ``/metrics``;
- an engine answers ``abort_request`` as verl's server does.

What this module does is what verl's agent-loop workers do through ``rollout.client``: ask for a group's replica,
send each request where the router says, resume a piece that repack took away, report what finished. It also
stands in for the trainer, publishing a new version every ``publish_every`` finished groups.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from verl_laminar.policy.migration import Piece, Response
from verl_laminar.rollout.repack import RepackMetrics
from verl_laminar.rollout.router import LaminarRouter, RepackSettings, ReplicaHandles


@dataclass(frozen=True)
class EngineReading:
    """An engine's KV-cache reading in the shape the router's reader returns (``rollout.vllm_metrics``)."""

    kv_tokens: int
    kv_capacity_tokens: int
    waiting: int
    kv_used: float


@dataclass
class RunResult:
    repack: bool
    makespan_s: float
    tokens: int
    trajectories: dict[str, Response]
    latency_s: list[float]
    kv_samples: list[float]
    refreshes: int  # refreshes after the run's first version was loaded everywhere
    repack_metrics: dict[str, float]
    extra: dict = field(default_factory=dict)


class RouterRun:
    """``replicas``: replica id -> engine actor; ``blobs``: each version's bytes (Ray object refs); ``work``: a
    ``bench.repack.PlannedGroups``; ``repack``: the router's repack settings (None: off); ``pool``: the
    partial-response pool actor, into which every response then streams its tokens."""

    def __init__(self, replicas: dict[int, Any], blobs: list, work: Any, groups_per_batch: int,
                 publish_every: int, sampling: dict, repack: Optional[RepackSettings] = None,
                 poll_s: float = 0.1, pool: Any = None) -> None:
        self.replicas, self.blobs, self.work, self.sampling = replicas, blobs, work, dict(sampling)
        self.publish_every, self.poll_s, self.pool, self.repack = publish_every, poll_s, pool, repack
        handles = [ReplicaHandles(rid, f"engine-{rid}", actor) for rid, actor in sorted(replicas.items())]
        self._by_address = {h.address: h.server for h in handles}
        self.router = LaminarRouter(handles, groups_per_batch, refresher=self._load, reader=self._reading,
                                    repack=repack)
        self.trajectories: dict[str, Response] = {}
        self.latency: list[float] = []
        self.kv_samples: list[float] = []
        self._finished_groups = 0
        self._published = 0
        self._done = asyncio.Event()

    async def _load(self, replica: ReplicaHandles, version: int) -> None:
        await replica.server.load_weights.remote(version, self.blobs[version])

    def _reading(self, address: str) -> EngineReading:
        import ray  # called in a worker thread by the router (as its HTTP read of /metrics is)

        s = ray.get(self._by_address[address].stats.remote())
        return EngineReading(int(s["kv_tokens"]), int(s["kv_capacity"]), int(s["waiting"]), float(s["kv_used"]))

    async def run(self) -> RunResult:
        await self.router.start(0)  # every engine loads version 0 through the router's refresh path
        loads_at_start = self.router.snapshot()["refreshes"]
        sampler = asyncio.get_running_loop().create_task(self._sample())
        t0 = time.monotonic()
        try:
            await asyncio.gather(*(self._group(gid) for gid in self.work.groups))
            makespan = time.monotonic() - t0
        finally:
            self._done.set()
            await sampler
            await self.router.close()
        snap = self.router.snapshot()
        tokens = sum(t.generated for t in self.trajectories.values())
        return RunResult(self.repack is not None, makespan, tokens, self.trajectories, self.latency,
                         self.kv_samples, snap["refreshes"] - loads_at_start,
                         snap["repack"] or RepackMetrics().as_dict())

    async def _sample(self) -> None:
        """The fleet's mean KV-cache use every ``poll_s`` (a measurement; the router reads on its own)."""
        while not self._done.is_set():
            got = await asyncio.gather(*(r.stats.remote() for r in self.replicas.values()))
            self.kv_samples.append(sum(s["kv_used"] for s in got) / len(got))
            try:
                await asyncio.wait_for(self._done.wait(), self.poll_s)
            except asyncio.TimeoutError:
                pass

    async def _group(self, gid: str) -> None:
        n = len(self.work.lengths[gid])
        a = await self.router.assign_group(gid, n)
        t0 = time.monotonic()
        await asyncio.gather(*(self._trajectory(gid, j, a.version, t0) for j in range(n)))
        self._finished_groups += 1
        # the trainer stand-in publishes before the group's end is reported, so the replica whose batch this
        # ends refreshes straight to the new version (no version is published after the last group)
        if self._finished_groups % self.publish_every == 0 and self._finished_groups < len(self.work.groups):
            self._published += 1
            await self.router.on_publish(self._published)
        await self.router.finish_group(gid)

    async def _trajectory(self, gid: str, j: int, version: int, t0: float) -> None:
        key = f"{gid}_{j}"
        sampling = dict(self.sampling)
        t = Response(key, tuple(self.work.prompts[gid]), self.work.lengths[gid][j], sampling)
        self.trajectories[key] = t
        pool_key = None
        if self.pool is not None:
            pool_key = f"{key}@{id(self)}"  # unique per run: the pool's keys are never reused
            await self.pool.open.remote(pool_key, gid, version, list(t.prompt_ids),
                                        dict(sampling, max_tokens=t.max_tokens))
        while not t.done:
            vid = f"{key}.{len(t.pieces)}"  # one vLLM request id per piece, as the product's client
            prompt, params = t.next_request()
            address, server = await self.router.acquire_pinned(vid, gid, version)
            try:
                out = await server.generate.remote(vid, prompt, params, pool_key=pool_key, pool_offset=t.generated)
            finally:
                await self.router.release_server(address, vid)
            lps = out["log_probs"]
            t.add(Piece(tuple(out["token_ids"]), None if lps is None else tuple(lps), out["version"],
                        out["replica_id"], bool(out["finished"])))
            if not t.done and not await self.router.migrated(vid):
                raise RuntimeError(f"{vid}: ended unfinished on replica {out['replica_id']} without being moved")
        if pool_key is not None:
            await self.pool.close.remote(pool_key)  # it reached the (here implicit) experience buffer
        await self.router.trajectory_finished(key, gid, len(t.prompt_ids), t.generated)
        self.latency.append(time.monotonic() - t0)
