"""The router's replica failover: a replica reported dead is probed, marked dead and its groups moved.

A component of ``rollout.router.LaminarRouter``, which hands it a narrow ``FailoverHost`` (the dispatch state to
read, a transition to commit, a refresh to start, the router to stop, an event to record) and the two books it
reads (``rollout.books``: replicas and groups); it keeps its own state (lost, parked, fenced, replacements to
come). The router's Ray API forwards the calls below to it. Dataflow:
    pinned client: a request fails with a Ray actor error -> replica_failed(group, version, error)
        -> the group's replica answers a probe?   yes: "alive" (the error was something else; it is raised)
        -> no: _fail(replica) -> policy.replica_loss.fail_replica: mark dead, move its open groups to live
           replicas of their version (each request continues there from what reached the partial-response
           pool, or from its prompt), the rest are lost -> "moved" / "lost"
    pinned client: continued_from_pool(group, request, tokens) -> counted in the "continued" events
    replacement loop (fleet.replacement): dead_replicas() -> a new replica starts -> add_replica(handles, relay,
        replaces): it joins unloaded; its first refresh pulls the newest version from its relay, then it takes
        groups; a start that failed: replacement_failed(dead)
A dead replica's groups move to live replicas of their version. With none, and a replacement on its way, they are
parked: every relay holds their version (``rollout.holds``: held already while their replica lived, if it lagged
behind the newest), their requests wait, and the replacement loads that
version first (not the newest), adopts the groups (their requests continue there from the pool), takes nothing
else, and refreshes to the newest once they finish. A replica that loads the version meanwhile adopts them too.
Otherwise (no replacement coming, a relay no longer holding the version, the replacement failed) they are lost:
their requests raise ReplicaLost, verl fails the group and refills the batch. While a replacement is on its way,
the router waits even with no replica alive; with none alive and none coming, it stops with an error.
    router: a refresh fails and the replica does not answer a probe -> _fail(replica); dispatch goes on
    pinned client: an output is garbage -> replica_misbehaved(group, version, reason, server) -> the replica is
        fenced: _fail(replica) at once (no probe: it answers, wrongly) -> "moved" / "lost"
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Optional, Protocol

from verl_laminar.policy.dispatch import (
    DispatchPlan,
    DispatchPolicy,
    DispatchState,
    RefreshDecision,
    RoutingError,
    add_replica,
    apply_plan,
    close_batch,
    move_group,
)
from verl_laminar.policy.holds import versions_to_hold
from verl_laminar.policy.replica_loss import fail_replica
from verl_laminar.rollout.books import CHAIN_MASTER, UNLOADED, GroupBook, ReplicaBook, ReplicaHandles
from verl_laminar.rollout.events import ParkedAdopted, ReplicaDied, RouterEvent
from verl_laminar.rollout.holds import RelayHolds

logger = logging.getLogger(__name__)


class FailoverHost(Protocol):
    """What failover needs from the loop that owns the dispatch state (the router), and nothing else of it. It
    computes each transition with the pure policy (``policy.replica_loss``, ``policy.dispatch``) from ``state()``
    and hands it back; no await lies between the two, so no other event interleaves."""

    def state(self) -> DispatchState: ...
    def commit(self, state: DispatchState) -> None: ...
    def published_version(self) -> Optional[int]: ...  # None before the first publication
    def closed(self) -> bool: ...
    def load(self, d: RefreshDecision) -> None: ...  # start this refresh (the router's VersionLoader)
    def spawn(self, coro: Any) -> None: ...  # a task the router awaits at close
    def pump(self) -> None: ...  # re-plan the dispatch
    def stop(self, error: BaseException) -> None: ...  # the router stops: waiting and later calls raise it
    def record(self, event: RouterEvent) -> None: ...  # one of the router's drained events (rollout.events)


class ReplicaFailover:
    def __init__(self, host: FailoverHost, replicas: ReplicaBook, groups: GroupBook, cfg: DispatchPolicy,
                 replacements: int, clock: Callable[[], float]) -> None:
        self._host, self._replicas, self._groups, self._cfg, self._clock = host, replicas, groups, cfg, clock
        self.lost: set[str] = set()  # groups of a dead replica that no live replica serves at their version
        self.parked: dict[int, set[str]] = {}  # version -> a dead replica's groups waiting for a replacement on it
        self.park_futs: dict[str, asyncio.Future] = {}  # parked group -> set when adopted or lost
        self._loading_parked: dict[int, int] = {}  # replacement -> the parked version it loads
        # versions kept beyond keep_versions, on the relays of live replicas: a lost machine's relay is gone, and
        # asking it failed every hold after a machine kill (emulated cluster, chaos --nodes)
        self.holds = RelayHolds(self._live_relays)
        self.replacements_left = int(replacements)  # deaths a replacement is still to come for (laminar.replace)
        self._awaiting: set[int] = set()  # dead replicas whose replacement is on its way
        self._fenced: set[int] = set()  # replicas failed for garbage output (what they streamed is not trusted)
        self.probe_timeout_s = 10.0

    # ---- the router's Ray API, forwarded ----
    async def replica_failed(self, group_id: str, version: int, error: str, server_id: Optional[str] = None) -> str:
        """A request of ``group_id`` sent to ``server_id`` (default: the group's replica) failed with an actor
        error. Returns "alive" (that replica answers a probe, so the error was not its death: the caller
        raises it), "moved" (retry: the group is on a live replica of its version), "moved_fresh" (the same, but the
        replica had been fenced for garbage output: the request starts over from its prompt) or "lost".
        The failed server is named by the caller because repack may have moved the group off it meanwhile."""
        if group_id in self.lost:
            return "lost"
        a = self._host.state().pins.get(group_id)
        if a is None:
            raise RoutingError(f"replica_failed for group {group_id!r}, which is not assigned")
        if a.version != version:
            raise RoutingError(f"replica_failed for group {group_id!r} with version {version}, but the group is "
                               f"pinned to {a.version}")
        failed = a.replica_id if server_id is None else self._replicas.by_address[server_id]
        if self._host.state().replica(failed).alive:
            if await self.probe(failed):
                return "alive"
            self.fail(failed, error)
        await self.parked_outcome(group_id)
        if group_id in self.lost:
            return "lost"
        state = self._host.state()
        if not state.replica(state.pins[group_id].replica_id).alive:
            return "lost"
        # a fenced replica's streamed tokens are not trusted: the request restarts from its prompt
        return "moved_fresh" if failed in self._fenced else "moved"

    async def replica_misbehaved(self, group_id: str, version: int, reason: str, server_id: str) -> str:
        """A request of ``group_id`` on ``server_id`` came back as garbage: that replica is fenced (marked dead
        like a lost one; the trainer ends its processes before a replacement takes its place) and the group moved.
        Returns "moved" (retry on the group's replica) or "lost"."""
        if group_id in self.lost:
            return "lost"
        if group_id not in self._host.state().pins:
            raise RoutingError(f"replica_misbehaved for group {group_id!r}, which is not assigned")
        self._fenced.add(self._replicas.by_address[server_id])
        self.fail(self._replicas.by_address[server_id], f"fenced: {reason}")
        await self.parked_outcome(group_id)
        if group_id in self.lost:
            return "lost"
        state = self._host.state()
        a = state.pins[group_id]
        return "moved" if a.version == version and state.replica(a.replica_id).alive else "lost"

    def open_groups_on(self, replica_id: int) -> int:
        """Groups on the replica that a death now would move or lose (fault injection waits for one)."""
        return len(set(self._host.state().replica(replica_id).open_groups) - self._groups.complete())

    def busy_replicas(self) -> list[int]:
        """Live replicas with requests in flight now (the hang watch judges only these)."""
        return sorted(r.replica_id for r in self._host.state().replicas
                      if r.alive and self._replicas.inflight.get(r.replica_id, 0))

    def movable_groups_on(self, replica_id: int) -> list[str]:
        """Of ``open_groups_on``, the groups a death now would move rather than lose (sorted ids): another live
        replica that is not refreshing serves their version (fault injection waits for one to test the
        continuation)."""
        state = self._host.state()
        served = {r.version for r in state.replicas
                  if r.alive and r.refreshing_to is None and r.replica_id != replica_id}
        open_ = set(state.replica(replica_id).open_groups) - self._groups.complete()
        return sorted(g for g in open_ if state.pins[g].version in served)

    def _live_relays(self) -> list:
        alive = {r.replica_id for r in self._host.state().replicas if r.alive} | {CHAIN_MASTER}
        return [relay for rid, relay in self._replicas.relays.items() if rid in alive]

    def dead_replicas(self) -> list[int]:
        return sorted(r.replica_id for r in self._host.state().replicas if not r.alive)

    def add_replica(self, replica: ReplicaHandles, relay: Any = None, replaces: Optional[int] = None) -> None:
        """A replacement (of dead replica ``replaces``) joins: it holds no weights yet, so the next plan refreshes it
        to the newest version (from ``relay``, its node's relay) and only then gives it groups. Its id must be
        new (``fleet.replacement``)."""
        rid = int(replica.replica_id)
        self._replicas.join(replica, relay)
        self._host.commit(add_replica(self._host.state(), rid, UNLOADED))
        self._awaiting.discard(replaces)
        version = self._host.published_version()
        waiting = sorted(v for v in self.parked if v not in self._loading_parked.values())
        if waiting:  # the oldest parked version first: its groups have waited longest
            version = self._loading_parked[rid] = waiting[0]
            d = RefreshDecision(rid, UNLOADED, version)
            self._host.commit(apply_plan(self._host.state(), DispatchPlan(refreshes=(d,)), self._cfg))
            self._host.load(d)
        logger.warning("replica %d joined the fleet (%s)%s; it loads version %s before it takes groups%s", rid,
                       replica.address, f" in place of replica {replaces}" if replaces is not None else "",
                       version, f" (the {len(self.parked[version])} parked groups of that version)" if waiting
                       else "")
        self._host.pump()

    def replacement_failed(self, dead: int, error: str) -> None:
        """The replacement of ``dead`` did not start: with no replica alive and none coming, the router stops."""
        self._awaiting.discard(int(dead))
        self._lose_unserved(f"the replacement of replica {dead} failed: {error}")
        self._stop_if_none_can_generate(f"the replacement of replica {dead} failed: {error}")

    # ---- what the router's own paths ask ----
    async def probe(self, replica_id: int) -> bool:
        """A dead actor fails any call at once; a hung one does not answer within the timeout."""
        import ray

        try:
            await asyncio.wait_for(self._replicas.handles[replica_id].server.__ray_ready__.remote(),
                                   self.probe_timeout_s)
            return True
        except (ray.exceptions.RayActorError, asyncio.TimeoutError) as e:
            logger.warning("replica %d does not answer a probe: %r", replica_id, e)
            return False

    def loads_parked(self, replica_id: int) -> bool:
        """It loads parked groups' version: a refresh must load exactly that one, never a newer one."""
        return replica_id in self._loading_parked

    async def parked_outcome(self, group_id: str) -> None:
        """Wait while the group is parked (until a replica adopts it, or it is lost)."""
        fut = self.park_futs.get(group_id)
        if fut is not None:
            await asyncio.shield(fut)

    def group_finished(self, group_id: str) -> None:
        """The group is over (its requests all finished or gave up): nothing waits for it any more."""
        self.lost.discard(group_id)
        for v in list(self.parked):
            self.parked[v].discard(group_id)
            if not self.parked[v]:  # nothing left to wait for that version (no replacement loads it for nothing)
                del self.parked[v]
        fut = self.park_futs.pop(group_id, None)
        if fut is not None:
            fut.set_result(None)

    def closing(self) -> None:
        self._lose_unserved("the run is ending", every=True)

    def fail(self, replica_id: int, error: str) -> None:
        """Mark the replica dead and move or lose its open groups (``policy.replica_loss``); idempotent."""
        if not self._host.state().replica(replica_id).alive:
            return
        state, loss = fail_replica(self._host.state(), replica_id, self._groups.n, self._groups.assigned_s,
                                   self._replicas.inflight, self._clock(), complete=self._groups.complete(),
                                   park=self.replacements_left > 0 and not self._host.closed())
        self._host.commit(state)
        self.lost.update(loss.lost)
        self._loading_parked.pop(replica_id, None)  # a replacement that died loading a parked version
        self._replicas.forget_requests(replica_id)
        # validation groups are not in the trainer's ledger: listed apart
        self._host.record(ReplicaDied(replica_id, self._clock(), error, tuple(tuple(m) for m in loss.moved),
                                      tuple(self._groups.sized(loss.lost)), tuple(self._groups.validation(loss.lost)),
                                      tuple(loss.complete), tuple(loss.parked)))
        logger.error("replica %d died (%s): %d open groups moved to live replicas of their version %s, %d lost %s, "
                     "%d parked for its replacement %s, %d already fully generated %s", replica_id, error,
                     len(loss.moved), dict(loss.moved), len(loss.lost), list(loss.lost), len(loss.parked),
                     list(loss.parked), len(loss.complete), list(loss.complete))
        if self.replacements_left > 0:  # laminar.replace: a new replica will take this one's place
            self.replacements_left -= 1
            self._awaiting.add(replica_id)
        if loss.parked:
            self._park(loss.parked_version, loss.parked)
        self._lose_unserved(f"replica {replica_id} died while loading a parked version")
        self._stop_if_none_can_generate(f"the last: {replica_id}, {error}")
        self._host.pump()

    def _stop_if_none_can_generate(self, why: str) -> None:
        if any(r.alive for r in self._host.state().replicas):
            return
        if self._awaiting:
            logger.warning("no rollout replica is alive (%s); waiting for the replacements of %s", why,
                           sorted(self._awaiting))
            return
        self._host.stop(RuntimeError(f"every rollout replica is dead and none is being replaced ({why})"))

    # ---- parked groups: a dead replica's groups waiting for a replacement on their version ----
    def _park(self, version: int, groups: tuple) -> None:
        loop = asyncio.get_running_loop()
        self.parked.setdefault(int(version), set()).update(groups)
        for g in groups:
            self.park_futs.setdefault(g, loop.create_future())
        self.sync_holds()  # usually held already (its replica had open groups); else held now, or the groups lost

    def _want_held(self) -> set[int]:
        return versions_to_hold(self._host.state(), self._host.published_version(), self.parked)  # policy.holds

    def sync_holds(self) -> None:
        """The relays keep what a death would need (``rollout.holds``): asked before every dispatch plan."""
        if not self._replicas.relays or self._host.closed():
            return
        if self.holds.stale(self._want_held(), set(self.parked)):
            self._host.spawn(self.holds.reconcile(self._want_held, lambda: set(self.parked), self._lose_parked))

    def adopt_parked(self, replica_id: int, version: int) -> None:
        """``replica_id`` now serves ``version``: it takes the groups parked on that version. A replacement that
        loaded it for them takes nothing else before they finish, then refreshes to the newest."""
        targeted = self._loading_parked.pop(replica_id, None) == version
        groups = sorted(self.parked.pop(version, ()))
        if not groups:
            return
        state = self._host.state()
        for g in groups:
            state = move_group(state, g, replica_id)
        if targeted:
            state = close_batch(state, replica_id, self._cfg)
        self._host.commit(state)
        for g in groups:
            self.park_futs.pop(g).set_result(None)
        self._host.record(ParkedAdopted(replica_id, version, tuple(groups), self._clock()))
        logger.warning("replica %d serves version %d: it adopts the %d groups parked on it %s", replica_id, version,
                       len(groups), groups)

    def _lose_parked(self, version: int, why: str) -> None:
        groups = sorted(self.parked.pop(version, ()))
        if not groups:
            return
        self.lost.update(groups)
        for g in groups:
            self.park_futs.pop(g).set_result(None)
        # a follow-up of the death that parked them (not a second death)
        self._host.record(ReplicaDied(None, self._clock(), why, (), tuple(self._groups.sized(groups)),
                                      tuple(self._groups.validation(groups)), (), (), followup=True))
        logger.error("the %d groups parked on version %d are lost: %s", len(groups), version, why)

    def _lose_unserved(self, why: str, every: bool = False) -> None:
        """Parked versions beyond what the replacements on their way (or loading) can serve are lost, oldest first;
        ``every``: all of them (the run ends)."""
        waiting = sorted(v for v in self.parked if every or v not in self._loading_parked.values())
        for v in waiting[:len(waiting) if every else max(0, len(waiting) - len(self._awaiting))]:
            self._lose_parked(v, why)
