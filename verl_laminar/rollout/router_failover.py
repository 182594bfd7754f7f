"""The router's replica failover: a replica reported dead is probed, marked dead and its groups moved.

Mixed into ``rollout.router.LaminarRouter`` (it uses the router's dispatch state, group sizes, in-flight
counts, events and waiters). Dataflow:
    pinned client: a request fails with a Ray actor error -> replica_failed(group, version, error)
        -> the group's replica answers a probe?   yes: "alive" (the error was something else; it is raised)
        -> no: _fail(replica) -> policy.replica_loss.fail_replica: mark dead, move its open groups to live
           replicas of their version (each request continues there from what reached the partial-response
           pool, or from its prompt), the rest are lost -> "moved" / "lost"
    pinned client: continued_from_pool(group, request, tokens) -> counted in the "continued" events
    replacement loop (fleet.replacement): dead_replicas() -> a new replica starts -> add_replica(handles, relay,
        replaces): it joins unloaded; its first refresh pulls the newest version from its relay, then it takes
        groups; a start that failed: replacement_failed(dead)
A dead replica's groups move to live replicas of their version or are lost (their requests raise ReplicaLost;
verl fails the group and refills the batch). While a replacement is on its way, the router waits even with no
replica alive; with none alive and none coming, it stops with an error: nothing can generate.
    router: a refresh fails and the replica does not answer a probe -> _fail(replica); dispatch goes on
    pinned client: an output is garbage -> replica_misbehaved(group, version, reason, server) -> the replica is
        fenced: _fail(replica) at once (no probe: it answers, wrongly) -> "moved" / "lost"
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Optional

from verl_laminar.policy.dispatch import RoutingError, add_replica
from verl_laminar.policy.replica_loss import fail_replica

if TYPE_CHECKING:
    from verl_laminar.rollout.router import ReplicaHandles

logger = logging.getLogger(__name__)


class ReplicaFailover:
    async def replica_failed(self, group_id: str, version: int, error: str, server_id: Optional[str] = None) -> str:
        """A request of ``group_id`` sent to ``server_id`` (default: the group's replica) failed with an actor
        error. Returns "alive" (that replica answers a probe, so the error was not its death: the caller
        raises it), "moved" (retry: the group is on a live replica of its version), "moved_fresh" (the same, but the
        replica had been fenced for garbage output: the request starts over from its prompt) or "lost".
        The failed server is named by the caller because repack may have moved the group off it meanwhile."""
        if group_id in self._lost:
            return "lost"
        a = self._state.pins.get(group_id)
        if a is None:
            raise RoutingError(f"replica_failed for group {group_id!r}, which is not assigned")
        if a.version != version:
            raise RoutingError(f"replica_failed for group {group_id!r} with version {version}, but the group is "
                               f"pinned to {a.version}")
        failed = a.replica_id if server_id is None else self._by_address[server_id]
        if self._state.replica(failed).alive:
            if await self._alive(failed):
                return "alive"
            self._fail(failed, error)
        if group_id in self._lost:
            return "lost"
        if not self._state.replica(self._state.pins[group_id].replica_id).alive:
            return "lost"
        # a fenced replica's streamed tokens are not trusted: the request restarts from its prompt
        return "moved_fresh" if failed in self._fenced else "moved"

    async def replica_misbehaved(self, group_id: str, version: int, reason: str, server_id: str) -> str:
        """A request of ``group_id`` on ``server_id`` came back as garbage: that replica is fenced (marked dead
        like a lost one; the trainer ends its processes before a replacement takes its place) and the group moved.
        Returns "moved" (retry on the group's replica) or "lost"."""
        if group_id in self._lost:
            return "lost"
        if group_id not in self._state.pins:
            raise RoutingError(f"replica_misbehaved for group {group_id!r}, which is not assigned")
        self._fenced.add(self._by_address[server_id])
        self._fail(self._by_address[server_id], f"fenced: {reason}")
        if group_id in self._lost:
            return "lost"
        a = self._state.pins[group_id]
        return "moved" if a.version == version and self._state.replica(a.replica_id).alive else "lost"

    def continued_from_pool(self, group_id: str, request_id: str, tokens: int) -> None:
        """A dead replica's request continues on the group's new replica from ``tokens`` it streamed to the
        partial-response pool (the trainer counts these: ``laminar/ft/pool_continued*``)."""
        self._events["continued"].append((group_id, request_id, int(tokens)))

    async def _alive(self, replica_id: int) -> bool:
        """A dead actor fails any call at once; a hung one does not answer within the timeout."""
        import ray

        try:
            await asyncio.wait_for(self._replicas[replica_id].server.__ray_ready__.remote(), self._probe_timeout_s)
            return True
        except (ray.exceptions.RayActorError, asyncio.TimeoutError) as e:
            logger.warning("replica %d does not answer a probe: %r", replica_id, e)
            return False

    def _complete_groups(self) -> set[str]:
        """Groups whose every response has been generated (still open while rewarded and stored)."""
        return {g for g, done in self._group_finished.items() if done >= self._group_n.get(g, done + 1)}

    def open_groups_on(self, replica_id: int) -> int:
        """Groups on the replica that a death now would move or lose (fault injection waits for one)."""
        return len(set(self._state.replica(replica_id).open_groups) - self._complete_groups())

    def busy_replicas(self) -> list[int]:
        """Live replicas with requests in flight now (the hang watch judges only these)."""
        return sorted(r.replica_id for r in self._state.replicas if r.alive and self._inflight.get(r.replica_id, 0))

    def movable_groups_on(self, replica_id: int) -> int:
        """Of ``open_groups_on``, the groups a death now would move rather than lose: another live replica that is
        not refreshing serves their version (fault injection waits for one to test the continuation)."""
        served = {r.version for r in self._state.replicas
                  if r.alive and r.refreshing_to is None and r.replica_id != replica_id}
        open_ = set(self._state.replica(replica_id).open_groups) - self._complete_groups()
        return sum(1 for g in open_ if self._state.pins[g].version in served)

    def dead_replicas(self) -> list[int]:
        return sorted(r.replica_id for r in self._state.replicas if not r.alive)

    def add_replica(self, replica: "ReplicaHandles", relay: Any = None, replaces: Optional[int] = None) -> None:
        """A replacement (of dead replica ``replaces``) joins: it holds no weights yet, so the next plan refreshes it
        to the newest version (from ``relay``, its node's relay) and only then gives it groups. Its id must be
        new (``fleet.replacement``)."""
        from verl_laminar.rollout.router import UNLOADED

        rid = int(replica.replica_id)
        if rid in self._replicas or replica.address in self._by_address:
            raise RoutingError(f"replica {rid} at {replica.address} is already in the fleet; a replacement needs a "
                               "new rank and server")
        self._state = add_replica(self._state, rid, UNLOADED)
        self._replicas[rid] = replica
        self._by_address[replica.address] = rid
        self._inflight[rid] = 0
        self._requests[rid] = set()
        if relay is not None:
            self._relays[rid] = relay
        self._awaiting.discard(replaces)
        logger.warning("replica %d joined the fleet (%s)%s; it loads version %s before it takes groups", rid,
                       replica.address, f" in place of replica {replaces}" if replaces is not None else "",
                       self._published)
        self._pump()

    def replacement_failed(self, dead: int, error: str) -> None:
        """The replacement of ``dead`` did not start: with no replica alive and none coming, the router stops."""
        self._awaiting.discard(int(dead))
        self._stop_if_none_can_generate(f"the replacement of replica {dead} failed: {error}")

    def _stop_if_none_can_generate(self, why: str) -> None:
        if any(r.alive for r in self._state.replicas):
            return
        if self._awaiting:
            logger.warning("no rollout replica is alive (%s); waiting for the replacements of %s", why,
                           sorted(self._awaiting))
            return
        self._error = RuntimeError(f"every rollout replica is dead and none is being replaced ({why})")
        for fut in self._waiters.values():
            if not fut.done():
                fut.set_exception(self._error)
        self._waiters.clear()

    def _fail(self, replica_id: int, error: str) -> None:
        """Mark the replica dead and move or lose its open groups (``policy.replica_loss``); idempotent."""
        if not self._state.replica(replica_id).alive:
            return
        complete = self._complete_groups()
        self._state, loss = fail_replica(self._state, replica_id, self._group_n, self._assigned_s,
                                         self._inflight, self._clock(), complete=complete)
        self._lost.update(loss.lost)
        self._inflight[replica_id] = 0
        self._requests[replica_id].clear()
        self._events["failures"].append({"replica_id": replica_id, "t": self._clock(), "error": error,
                                         "moved": [list(m) for m in loss.moved],
                                         # validation groups are not in the trainer's ledger: listed apart
                                         "lost": [(g, self._group_n.get(g, 0)) for g in loss.lost
                                                  if g not in self._validate],
                                         "lost_validation": [g for g in loss.lost if g in self._validate],
                                         "complete": list(loss.complete)})
        logger.error("replica %d died (%s): %d open groups moved to live replicas of their version %s, %d lost %s, "
                     "%d already fully generated %s", replica_id, error, len(loss.moved), dict(loss.moved),
                     len(loss.lost), list(loss.lost), len(loss.complete), list(loss.complete))
        if self._replacements_left > 0:  # laminar.replace: a new replica will take this one's place
            self._replacements_left -= 1
            self._awaiting.add(replica_id)
        self._stop_if_none_can_generate(f"the last: {replica_id}, {error}")
        self._pump()
