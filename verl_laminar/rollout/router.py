"""The Laminar router: whole prompt groups to one replica, per-replica refresh, version-pinned requests.

Dataflow (one asyncio loop; the Ray actor shell: ``rollout.router_actor.spawn_router``):
    agent-loop worker  assign_group(uid, n)   -> queued; every event re-plans (policy.dispatch) and resolves
                                                 the waiting call with an Assignment (replica, version)
    pinned client      acquire_pinned(req, uid, version) -> (server address, handle); in-flight += 1
                       release_server(address)           -> in-flight -= 1
    agent-loop worker  trajectory_finished(key, uid, ...) -> the trainer's latest published version n
                       finish_group(uid)      -> the replica's batch may end -> refresh to the newest
                                                 version (refresh_replica) -> it takes the next groups
    trainer            on_publish(v) / drain_events() / snapshot()
    repack (optional)  every interval and after each publication (rollout.repack_driver, given a narrow
                       RepackHost: the router's methods under "repack host"): read each server's vLLM /metrics,
                       plan (rollout.repack.RepackRounds), move the source's open groups to the target
                       (apply_repack) and abort the source's requests; the pinned client sees the aborted
                       output, asks migrated(request_id) and resumes on the target with prompt + partial
                       response (same version, remaining budget)

A replica refreshes only when its own batch ended and nothing of it is in flight; no other replica waits.
A refresh (``rollout.refresh.VersionLoader``, given a narrow ``RefreshHost``: the router's methods under "refresh
host") waits until the replica's relay committed the version, with deadlines that scale with the version's size and
the chain's length, and retries a failed wait; the router applies its outcome. verl's RequestLoadBalancer protocol:
``rollout.balancer``. A replica dies: ``rollout.router_failover.ReplicaFailover``, a component given a narrow
``FailoverHost`` (the router's methods under "failover host") and the books it reads (``rollout.books``).
``bench.repack`` drives this same loop over its own engines (``bench.router_run``). The staleness bound:
``rollout.router_bound`` (admission in ``_pump``; the trainer's batch from ``plan_batch``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable, Optional, Sequence

from verl_laminar.policy.dispatch import (
    Assignment,
    DispatchPlan,
    DispatchPolicy,
    DispatchState,
    RefreshDecision,
    RoutingError,
    abandon_refresh,
    apply_plan,
    complete_refresh,
    finish_group,
    initial_state,
    plan_dispatch,
    route,
)
from verl_laminar.policy.replica_loss import ReplicaLost
from verl_laminar.policy.timeouts import RefreshSettings
from verl_laminar.rollout import events as ev
from verl_laminar.rollout.balancer import VerlBalancerProtocol
from verl_laminar.rollout.books import UNLOADED, GroupBook, ReplicaBook, ReplicaHandles
from verl_laminar.rollout.refresh import LoaderSettings, VersionLoader, refresh_replica
from verl_laminar.rollout.repack import RepackRounds, apply_moves
from verl_laminar.rollout.repack_driver import RepackDriver, RepackSettings
from verl_laminar.rollout.router_bound import BoundBook
from verl_laminar.rollout.router_failover import ReplicaFailover

logger = logging.getLogger(__name__)

__all__ = ["LaminarRouter", "ReplicaHandles", "RepackSettings", "UNLOADED"]


Refresher = Callable[[ReplicaHandles, int], Awaitable[None]]


class LaminarRouter(VerlBalancerProtocol):
    def __init__(self, replicas: Sequence[ReplicaHandles], groups_per_batch: int,
                 refresher: Optional[Refresher] = None, drain_timeout_s: float = 30.0,
                 relays: Optional[dict] = None,
                 clock: Callable[[], float] = time.monotonic, repack: Optional[RepackSettings] = None,
                 reader: Optional[Callable[[str], Any]] = None, refresh: Optional[RefreshSettings] = None,
                 chain_relays: int = 1, replacements: int = 0, max_staleness: Optional[int] = None,
                 batch_groups: Optional[int] = None) -> None:
        self._book = ReplicaBook.of(replicas, relays)  # handles, relays, requests in flight (rollout.books)
        self._groups = GroupBook()  # sizes, responses finished, assignment times, validation groups
        self._cfg = DispatchPolicy(groups_per_batch)
        refresher = refresher or (lambda replica, version: refresh_replica(replica.workers, version))
        self._clock = clock
        self._loader = VersionLoader(self, lambda rid: self._book.relays.get(rid),
                                     lambda rid, v: refresher(self._book.handles[rid], v),
                                     LoaderSettings(refresh or RefreshSettings(), chain_relays, drain_timeout_s),
                                     clock)
        self._state = initial_state(self._book.handles, UNLOADED)
        self._queue: list[str] = []
        self._waiters: dict[str, asyncio.Future] = {}
        self._published: Optional[int] = None
        self._bounds = BoundBook(max_staleness, batch_groups)  # policy.bound: untrained groups, steps sampled
        self._tasks: set[asyncio.Task] = set()
        self._events = ev.EventLog()  # typed events the trainer drains (rollout.events)
        # dead, parked, lost and fenced replicas and groups, replacements to come (rollout.router_failover)
        self._failover = ReplicaFailover(self, self._book, self._groups, self._cfg, replacements, clock)
        self._rollout_wait_s, self._refreshes = 0.0, 0
        self._error: Optional[BaseException] = None
        self._closed = False
        self._repack = (RepackDriver(self, RepackRounds(repack.policy), repack.interval_s, reader, clock)
                        if repack else None)

    # ---- trainer side ----
    async def on_publish(self, version: int) -> None:
        if self._published is not None and version <= self._published:
            raise ValueError(f"published version {version} is not newer than {self._published}")
        self._published = int(version)
        self._pump()
        if self._repack is not None and self._repack.started:
            self.spawn(self._repack.round())  # Laminar repacks right after each publication too

    async def start(self, version: int, timeout_s: Optional[float] = None) -> dict[int, int]:
        """Publish v0 and wait until every live replica serves it (the same refresh path as later versions).

        ``timeout_s`` None: no overall bound, because each refresh already fails after its own deadlines
        and retries (``policy.timeouts``), which scale with the model; a fixed bound would kill large ones.
        """
        await self.on_publish(version)
        deadline = None if timeout_s is None else self._clock() + timeout_s
        while any(r.alive and r.version < version for r in self._state.replicas):
            self._raise_if_failed()
            if deadline is not None and self._clock() > deadline:
                raise TimeoutError(f"replicas did not load version {version} in {timeout_s} s: {self.versions()}")
            await asyncio.sleep(0.05)
        self._raise_if_failed()  # every replica died while loading
        if self._repack is not None and not self._repack.started:
            self._repack.start()
        return self.versions()

    def plan_batch(self, step: int, ready: list, dropped: Sequence = (), size: Optional[int] = None) -> Optional[list]:
        """The ``size`` groups of ``ready`` (group, version) step ``step`` trains, or None: wait (``router_bound``)."""
        chosen = self._bounds.plan(step, ready, self._state.pins, self._groups.validate, dropped, size)
        if chosen is not None or dropped:
            self._pump()  # the next step's admission opens, or a dropped group's room
        return chosen

    async def close(self, timeout_s: float = 60.0) -> None:
        """Stop dispatching and refreshing (before the relays go away); waits for loads in progress."""
        self._closed = True
        self._failover.closing()
        if self._repack is not None:
            self._repack.stop()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout_s)

    def drain_events(self) -> ev.RouterEvents:
        """The events since the last drain, with ``clock``: (this router's clock now, Unix time now), so that the
        trainer, maybe on another node, can turn the events' router-clock times into wall-clock times."""
        return self._events.drain((self._clock(), time.time()))

    def versions(self) -> dict[int, int]:
        return self._state.versions()

    def snapshot(self) -> dict[str, Any]:
        wait, self._rollout_wait_s = self._rollout_wait_s, 0.0
        return {"versions": self.versions(), "published": self._published, "queued": len(self._queue),
                "inflight": dict(self._book.inflight), "refreshes": self._refreshes, "rollout_wait_s": wait,
                "open_groups": {r.replica_id: len(r.open_groups) for r in self._state.replicas},
                "dead": sorted(r.replica_id for r in self._state.replicas if not r.alive),
                "repack": self._repack.metrics() if self._repack else {}}

    # ---- agent-loop side ----
    async def assign_group(self, group_id: str, n: int, validate: bool = False) -> Assignment:
        self._raise_if_failed()
        if group_id in self._waiters or group_id in self._state.pins:
            raise RoutingError(f"group {group_id!r} asked for a replica twice")
        fut = asyncio.get_running_loop().create_future()
        self._waiters[group_id] = fut
        self._groups.n[group_id] = int(n)
        if validate:
            # validation runs on the replicas' current versions; it goes first so it delays training least
            self._groups.validate.add(group_id)
            self._queue.insert(0, group_id)
        else:
            self._queue.append(group_id)
        self._pump()
        return await fut

    async def adopt_group(self, group_id: str, n: int, version: int) -> Optional[Assignment]:
        """A re-issued group whose whole responses a detached replica finished while the trainer was down
        (``policy.adopt``): pinned to their version on no replica; its sessions are answered from the pool."""
        self._raise_if_failed()
        if group_id in self._waiters or group_id in self._state.pins or group_id in self._groups.adopted:
            raise RoutingError(f"group {group_id!r} asked for a replica twice")
        while self._published is None:  # a resumed trainer's re-issued prompts may come before its first publication
            self._raise_if_failed()
            await asyncio.sleep(0.05)
        if not self._bounds.bound.adoptable(version, self._bounds.next_step(self._published)):
            return None  # older than laminar.buffer.max_staleness allows: the caller generates it again
        a = self._groups.adopt(group_id, n, version, self._published, self._clock())
        for i in range(n):
            self._events.add(ev.Started(f"{group_id}_{i}", group_id, a.replica_id, a.version))
        return a

    async def acquire_pinned(self, request_id: str, group_id: str, version: int) -> tuple[str, Any]:
        await self._failover.parked_outcome(group_id)
        if group_id in self._failover.lost:
            raise ReplicaLost(f"group {group_id!r} (version {version}) was on a replica that died, and no live "
                              "replica serves that version; verl fails the group and refills the batch")
        a = route(self._state, group_id)  # raises if the replica no longer serves the group's version
        if a.version != version:
            raise RoutingError(f"request {request_id} of group {group_id!r} carries version {version}, "
                               f"but the group is pinned to {a.version}")
        r = self._book.acquire(a.replica_id, request_id)
        return r.address, r.server

    async def release_server(self, server_id: str, request_id: Optional[str] = None) -> None:
        self._book.release(server_id, request_id)

    async def migrated(self, request_id: str) -> bool:
        """Was this (aborted) request taken off its replica by repack? Asked once per aborted request."""
        return self._repack is not None and self._repack.take_migrated(request_id)

    async def trajectory_finished(self, key: str, group_id: str, prompt_tokens: int, response_tokens: int,
                                  start_s: Optional[float] = None) -> int:
        """Record one finished response; returns n, the trainer's latest published version."""
        a = self._state.pins.get(group_id) or self._groups.adopted.get(group_id)
        if a is None:
            raise RoutingError(f"trajectory {key!r} finished for group {group_id!r}, which is not assigned")
        n = int(self._published)
        self._groups.finished[group_id] = self._groups.finished.get(group_id, 0) + 1
        if group_id not in self._groups.validate:
            self._events.add(ev.Finished(key, group_id, a.replica_id, a.version, start_s, self._clock(),
                                      self._groups.assigned_s.get(group_id), int(prompt_tokens),
                                      int(response_tokens), n))
        return n

    async def finish_group(self, group_id: str) -> None:
        pin = self._state.pins.get(group_id) or self._groups.adopted.get(group_id)
        self._bounds.finished(group_id, pin, self._groups)  # a training group waits for the trainer (plan_batch)
        adopted = self._groups.adopted.pop(group_id, None) is not None
        self._state, ended = (self._state, False) if adopted else finish_group(self._state, group_id)
        self._groups.forget(group_id)
        self._failover.group_finished(group_id)  # lost, or parked while its requests all gave up
        if ended:
            self._pump()

    async def report_violation(self, message: str) -> None:
        logger.error("invariant violation reported by a rollout worker: %s", message)
        self._events.add(ev.Violation(message))

    def servers(self) -> list[str]:
        return list(self._book.by_address)

    def total_inflight(self) -> int:
        return self._book.total_inflight()

    def inflight_on(self, replica_id: int) -> int:
        """Requests in flight on one replica (fault injection waits for some before a kill)."""
        return self._book.inflight[replica_id]

    # ---- replica deaths and replacements (rollout.router_failover; the Ray API forwards) ----
    async def replica_failed(self, group_id: str, version: int, error: str, server_id: Optional[str] = None) -> str:
        return await self._failover.replica_failed(group_id, version, error, server_id)

    async def replica_misbehaved(self, group_id: str, version: int, reason: str, server_id: str) -> str:
        return await self._failover.replica_misbehaved(group_id, version, reason, server_id)

    def continued_from_pool(self, group_id: str, request_id: str, tokens: int) -> None:
        """A dead replica's request continues from the pool (the trainer counts: ``laminar/ft/pool_continued*``)."""
        self._events.add(ev.Continued(group_id, request_id, int(tokens)))

    def add_replica(self, replica: ReplicaHandles, relay: Any = None, replaces: Optional[int] = None) -> None:
        self._failover.add_replica(replica, relay, replaces)

    def replacement_failed(self, dead: int, error: str) -> None:
        self._failover.replacement_failed(dead, error)

    def dead_replicas(self) -> list[int]:
        return self._failover.dead_replicas()

    def open_groups_on(self, replica_id: int) -> int:
        return self._failover.open_groups_on(replica_id)

    def movable_groups_on(self, replica_id: int) -> list[str]:
        return self._failover.movable_groups_on(replica_id)

    def busy_replicas(self) -> list[int]:
        return self._failover.busy_replicas()

    def spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- repack host (rollout.repack_driver.RepackHost) ----
    def repack_candidates(self) -> list[tuple[ReplicaHandles, int]]:
        return [(self._book.handles[r.replica_id], r.version) for r in self._state.replicas
                if r.alive and r.refreshing_to is None]

    def requests_on(self, replica_id: int) -> set[str]:
        return self._book.requests[replica_id]

    def taking(self) -> set[int]:
        """Replicas still taking groups: only while groups wait in the queue (else each is in its tail)."""
        return {r.replica_id for r in self._state.replicas if self._queue and r.accepts(self._cfg)}

    def apply_repack(self, plan: list) -> list:
        self._state, applied = apply_moves(self._state, plan, self._cfg)
        return applied

    def pump(self) -> None:
        self._pump()

    # ---- refresh host (rollout.refresh.RefreshHost): what a refresh reads, and its outcome applied ----
    def serves(self, replica_id: int) -> bool:
        return self._state.replica(replica_id).alive

    async def answers(self, replica_id: int) -> bool:
        return await self._failover.probe(replica_id)

    def published(self) -> int:
        return int(self._published)

    def closed(self) -> bool:
        return self._closed

    def exact_version(self, replica_id: int) -> bool:
        return self._failover.loads_parked(replica_id)

    def retarget(self, replica_id: int, version: int) -> None:
        self._state = abandon_refresh(self._state, replica_id)
        d = RefreshDecision(replica_id, self._state.replica(replica_id).version, version)
        self._state = apply_plan(self._state, DispatchPlan(refreshes=(d,)), self._cfg)

    def refreshed(self, d: RefreshDecision, loaded: int, t0: float, t1: float) -> None:
        if not self._state.replica(d.replica_id).alive:
            return  # it was failed over while loading (its refreshing_to was cleared then)
        self._state = complete_refresh(self._state, d.replica_id, loaded)
        self._failover.adopt_parked(d.replica_id, loaded)  # groups of a dead replica waiting for this version
        self._rollout_wait_s += t1 - t0
        self._refreshes += 1
        # t0 includes the drain and the wait for the relay: the replica serves nothing from t0 on
        self._events.add(ev.Loaded(d.replica_id, loaded, t1, t0, d.from_version))
        logger.info("replica %d: version %d -> %d in %.2f s", d.replica_id, d.from_version, loaded, t1 - t0)
        self._pump()

    def refresh_died(self, d: RefreshDecision, error: BaseException) -> None:
        logger.error("refresh of replica %d to version %d failed: the replica is dead (%r)", d.replica_id,
                     d.to_version, error)
        self._failover.fail(d.replica_id, f"died while loading version {d.to_version}: {error!r}")

    def refresh_failed(self, d: RefreshDecision, error: BaseException) -> None:
        self._state = abandon_refresh(self._state, d.replica_id)
        if self._closed:
            logger.info("refresh of replica %d stopped by close: %r", d.replica_id, error)
            return
        logger.error("refresh of replica %d to version %d failed: %r", d.replica_id, d.to_version, error)
        self.stop(error, RuntimeError(f"refresh of replica {d.replica_id} failed: {error!r}"))

    # ---- failover host (rollout.router_failover.FailoverHost) ----
    def state(self) -> DispatchState:
        return self._state

    def commit(self, state: DispatchState) -> None:
        self._state = state

    def published_version(self) -> Optional[int]:
        return self._published

    def load(self, d: RefreshDecision) -> None:
        self.spawn(self._loader.run(d))

    def stop(self, error: BaseException, told: Optional[BaseException] = None) -> None:
        """The router stops: every waiting ``assign_group`` raises ``told`` (default ``error``), later calls too;
        it plans nothing more (``_pump``), and the trainer's next wait for samples raises ``failure()``."""
        self._error = error
        for fut in self._waiters.values():
            if not fut.done():
                fut.set_exception(told or error)
        self._waiters.clear()
        self._queue = []  # their waiters were failed just now

    def failure(self) -> Optional[str]:
        return None if self._error is None else repr(self._error)

    def record(self, event: ev.RouterEvent) -> None:
        self._events.add(event)

    # ---- planning ----
    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"the router stopped: {self._error!r}") from self._error

    def _pump(self) -> None:
        self._failover.sync_holds()  # the relays keep what a death would need (rollout.holds)
        if self._published is None or self._closed or self._error is not None:
            return  # nothing published yet (replicas hold no weights), shutting down, or stopped
        floor, limit = self._bounds.admission(self._state.pins, self._groups.validate, self._published)
        plan = plan_dispatch(self._state, self._queue, self._published, self._cfg, floor, limit, self._groups.validate)
        self._state = apply_plan(self._state, plan, self._cfg)
        self._queue = list(plan.waiting)
        for d in plan.refreshes:
            self.load(d)
        for a in plan.assignments:
            self._groups.assigned_s[a.group_id] = self._clock()
            if a.group_id not in self._groups.validate:
                for i in range(self._groups.n[a.group_id]):
                    self._events.add(ev.Started(f"{a.group_id}_{i}", a.group_id, a.replica_id, a.version))
            self._waiters.pop(a.group_id).set_result(a)
