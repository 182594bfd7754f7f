"""Failover execution for ``FtRuntime``: the pure decisions of ``policy.failover`` carried out on real actors.

    heartbeat_loop   one ping in flight per replica; an actor error or ``dead_after_s`` of silence -> dead
    replica_failed   fence the replica (ray.kill, its vLLM processes reaped by PID), plan failover (pure),
                     then: move orphaned groups whole to a live replica of their version, or wait for a
                     replacement that loads that version from a relay, or regenerate them (counted)
    _replace         a new replica in the dead one's place, first serving the version its groups wait for

A mixin of ``FtRuntime`` (it shares the runtime's dispatch state and task set); kept apart so the runtime
module holds the normal path and this one the failure path.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Optional

from verl_laminar.policy.dispatch import add_replica, finish_group, mark_dead, move_group
from verl_laminar.policy.failover import Health, OrphanGroup, ReplicaView, plan_failover

logger = logging.getLogger(__name__)


class FailoverMixin:
    """Needs from the runtime: s, state, replicas, pids, beats, faults, work, pool, relay_group, started_s,
    next_rid, _failing, _stop, _spawn, _start_replica, _relay_for, _pool_key, pump."""

    async def replica_failed(self, rid: int, why: str) -> None:
        """Mark dead once, fence it, plan failover (pure policy) and execute the plan."""
        import ray

        from verl_laminar.platform.procs import reap

        if rid in self._failing or not self.state.replica(rid).alive:
            return
        self._failing.add(rid)
        now = time.monotonic()
        logger.warning("replica %d is dead (%s); failing over", rid, why)
        fault = next((f for f in reversed(self.faults) if f.target == f"replica{rid}" and f.t_detect is None), None)
        if fault is not None:
            fault.t_detect = time.time()
        ray.kill(self.replicas[rid])  # fence: a wedged replica must not keep writing to the pool
        # its vLLM engine processes, by PID, off the loop (reap waits for them to exit)
        self._spawn(asyncio.to_thread(reap, self.pids.get(rid, [])[1:]))
        self.state = mark_dead(self.state, rid)
        orphans = [OrphanGroup(g, a.version, len(self.work.lengths[g]), self.started_s.get(g, now))
                   for g, a in self.state.pins.items() if a.replica_id == rid]
        load = {r.replica_id: 0 for r in self.state.replicas}
        for g, a in self.state.pins.items():
            load[a.replica_id] += len(self.work.lengths[g])
        views = [ReplicaView(r.replica_id, r.version, Health.ALIVE if r.alive and r.refreshing_to is None
                             else Health.DEAD, load[r.replica_id]) for r in self.state.replicas]
        kept = await self._relay_versions()
        plan = plan_failover(orphans, views, now, kept, self.s.max_age_s)
        for gid, target in plan.moves:
            self.state = move_group(self.state, gid, target)
            self._spawn(self._reassign(gid, target))
        for gid in plan.regenerate:
            self.state, _ = finish_group(self.state, gid)  # unpinned: _placed raises Regenerate
        new_id = self.next_rid
        self.next_rid += 1
        version = plan.replacements[0][0] if plan.replacements else None
        waiting = plan.replacements[0][1] if plan.replacements else ()
        for v, gs in plan.replacements[1:]:  # one replacement per failure; other versions regenerate
            for gid in gs:
                self.state, _ = finish_group(self.state, gid)
        if fault is not None:
            fault.detail.update(orphans=len(orphans), moved=len(plan.moves), regenerated=len(plan.regenerate),
                                waiting_for_replacement=len(waiting))
            if not waiting:
                fault.t_recovered = time.time()  # every orphan is placed on a live replica again
        self._spawn(self._replace(rid, new_id, version, waiting, fault))
        self.pump()

    async def _reassign(self, gid: str, target: int) -> None:
        """Record in the pool where the group's responses continue (what ``on_replica`` answers)."""
        if self.pool is None:
            return
        opened = self.pool_opened.get(self._pool_key(gid, 0))
        if opened is None:
            return  # its run has not opened entries yet: it opens them on the replica it is pinned to now
        await opened.wait()  # the opens are in flight (the group was moved while run_group awaited them)
        await asyncio.gather(*(self.pool.reassign.remote(self._pool_key(gid, j), target)
                               for j in range(len(self.work.lengths[gid]))))

    async def _relay_versions(self) -> list[int]:
        import ray

        try:
            master = await self.relay_group.master.remote()
            relay = ray.get_actor(await self.relay_group.actor_name.remote(master), namespace=self.s.namespace)
            return list(await relay.versions.remote()) + [0]  # v0 is the model every replica starts from
        except Exception:  # noqa: BLE001 - no relay answers: only v0 can be rebuilt
            return [0]

    async def _replace(self, dead: int, rid: int, version: Optional[int], waiting: tuple, fault: Any) -> None:
        """Start a replica in the dead one's place; it first serves ``version`` when groups wait for it."""
        from ray.exceptions import RayTaskError

        h = await self._start_replica(rid)
        loaded = 0  # every replica starts on the model's weights, version 0
        if version:
            try:
                await h.load_from_relay.remote(version, f"{self.s.namespace}_relays", self._relay_for(rid),
                                               self.s.namespace)
                loaded = version
            except RayTaskError as e:
                # the relays moved past it (they keep the newest and the previous version) while the
                # replacement started: the waiting groups are regenerated with the newest weights
                logger.warning("replacement %d could not load version %d (%s); regenerating %d groups", rid,
                               version, e.cause if hasattr(e, "cause") else e, len(waiting))
        self.replicas[rid] = h
        self.state = add_replica(self.state, rid, loaded)
        for gid in waiting:
            if gid in self.state.pins:
                if loaded == version:
                    self.state = move_group(self.state, gid, rid)
                    await self._reassign(gid, rid)
                else:
                    self.state, _ = finish_group(self.state, gid)  # unpinned: _placed raises Regenerate
        if fault is not None and loaded != version:
            fault.detail["regenerated_groups"] = fault.detail.get("regenerated_groups", 0) + len(waiting)
        if fault is not None:
            fault.detail["replacement_s"] = time.time() - fault.t_kill
            if fault.t_recovered is None:
                fault.t_recovered = time.time()
        logger.info("replica %d replaces %d (version %s, %d groups waited)", rid, dead, version, len(waiting))
        self.pump()

    async def heartbeat_loop(self) -> None:
        from ray.exceptions import RayActorError

        hb = self.s.heartbeat
        pending: dict[int, asyncio.Task] = {}

        async def beat(rid: int) -> None:
            # one ping in flight per replica; a late answer still counts as a beat when it arrives
            try:
                await self.replicas[rid].ping.remote()
                self.beats[rid] = time.monotonic()
            except RayActorError:
                self.beats[rid] = float("-inf")  # an actor error is a death notice, not a late beat

        while not self._stop.is_set():
            live = [r.replica_id for r in self.state.replicas if r.alive and r.replica_id in self.replicas]
            for rid in live:
                if rid not in pending or pending[rid].done():
                    pending[rid] = asyncio.get_running_loop().create_task(beat(rid))
            await asyncio.sleep(hb.interval_s)
            now = time.monotonic()
            for rid in live:
                if hb.health(self.beats[rid], now) is Health.DEAD:
                    await self.replica_failed(rid, f"no heartbeat for {now - self.beats[rid]:.1f} s")
