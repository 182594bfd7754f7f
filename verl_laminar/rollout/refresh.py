"""Load one weight version into one rollout replica, without touching any other replica.

verl has no call for this (its ``CheckpointEngineManager.update_weights`` aborts and syncs every replica);
its pieces do: each ``CheckpointEngineWorker.update_weights(global_steps)`` of the replica reads the version
from this machine's relay and pushes it into the vLLM engine, then labels the server with ``global_steps``.
The router calls this only for an idle replica (its batch ended, nothing in flight), so no abort/resume.

Dataflow of one refresh (``VersionLoader.run``, a component of ``rollout.router.LaminarRouter``, which hands it a
narrow ``RefreshHost``: what the refresh reads of the fleet's state and the three outcomes it reports back):
    drain the replica's last releases
    -> wait until its relay committed the version (relay.newest; relay.progress shows chunks still arriving,
       which keeps the wait alive; the deadline comes from ``policy.timeouts``)
    -> load it (refresh_replica, bounded by the load deadline)
    a failed wait: retried ``laminar.refresh.retries`` times, then the router stops as before; a failed load
    stops it at once (the engine may hold part of the version);
    a newer version readable by the time the wait ends: the replica loads that one (never an evicted one);
    the replica died: it is failed over (``rollout.router_failover``), dispatch goes on.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Optional, Protocol, Sequence

from verl_laminar.policy.dispatch import RefreshDecision
from verl_laminar.policy.timeouts import (
    RefreshDeadlines,
    RefreshSettings,
    arrival_mark,
    chunk_count,
    refresh_deadlines,
)

logger = logging.getLogger(__name__)

_DEADLINE_KEYS = "laminar.refresh.min_wait_s / laminar.refresh.wait_factor / laminar.relay.link_gbps"


class ReadableTimeout(TimeoutError):
    """A relay went a whole deadline without committing the version or receiving a chunk of it."""


class LoadTimeout(TimeoutError):
    """A replica did not finish loading a version from its relay within the load deadline."""


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


def _manifest_size(desc: dict) -> tuple[Optional[int], Optional[int]]:
    """(total bytes, chunk count) of a relay's ``describe`` answer; (None, None) if it carries no manifest."""
    manifest = desc.get("manifest")
    if isinstance(manifest, (str, bytes)):
        manifest = json.loads(manifest)
    info = {**(manifest or {}), **desc}
    total, size = info.get("total_bytes"), info.get("chunk_size")
    if total is None:
        return None, None
    return int(total), (chunk_count(int(total), int(size)) if size else None)


class RefreshHost(Protocol):
    """What a refresh needs from the loop that owns the dispatch state (the router), and nothing else of it. The
    loader never changes that state itself: it asks (``retarget``) or reports (``refreshed``, ``refresh_died``,
    ``refresh_failed``), and the host applies the transition."""

    def serves(self, replica_id: int) -> bool: ...  # alive in the dispatch state
    async def answers(self, replica_id: int) -> bool: ...  # a probe of the replica's server
    def inflight_on(self, replica_id: int) -> int: ...
    def published(self) -> int: ...
    def closed(self) -> bool: ...
    def exact_version(self, replica_id: int) -> bool: ...  # it loads parked groups' version: never a newer one
    def retarget(self, replica_id: int, version: int) -> None: ...
    def refreshed(self, d: RefreshDecision, loaded: int, t0: float, t1: float) -> None: ...
    def refresh_died(self, d: RefreshDecision, error: BaseException) -> None: ...
    def refresh_failed(self, d: RefreshDecision, error: BaseException) -> None: ...


@dataclass
class LoaderSettings:
    """Deadlines (``policy.timeouts``) and the drain bound; ``chain_relays``: the relay chain's length."""

    refresh: RefreshSettings
    chain_relays: int = 1
    drain_timeout_s: float = 30.0
    poll_s: float = 0.1


class VersionLoader:
    """Waits for a version on a replica's relay and loads it, with the deadlines and retries of ``policy.timeouts``.

    ``relay_of(replica)``: its machine-local relay actor (or None: nothing to wait for); ``load(replica, version)``:
    the refresher (verl's workers pull from the relay)."""

    def __init__(self, host: RefreshHost, relay_of: Callable[[int], Any],
                 load: Callable[[int, int], Awaitable[None]], settings: LoaderSettings,
                 clock: Callable[[], float]) -> None:
        self._host, self._relay_of, self._load_fn = host, relay_of, load
        self._settings, self._clock = settings, clock
        # the deadlines scale with the version's size, learnt from the first committed version's manifest
        self.version_bytes: Optional[int] = None
        self.version_chunks: Optional[int] = None

    def _deadlines(self) -> RefreshDeadlines:
        s = self._settings
        return refresh_deadlines(self.version_bytes, max(1, int(s.chain_relays)), s.refresh, self.version_chunks)

    async def _wait_readable(self, replica_id: int, version: int) -> None:
        """The trainer's publish returns before the relay has committed the version. A load must not start
        earlier: a failed read after verl's weight-transfer handshake leaves the vLLM receiver out of step.
        A large version takes minutes down the chain, so the wait fails only once no chunk arrived for a
        whole deadline, not after a fixed time."""
        relay = self._relay_of(replica_id)
        if relay is None:
            return
        t0 = last = self._clock()
        seen: Optional[tuple] = None
        while True:
            newest = await relay.newest.remote()
            if newest is not None and newest >= version:
                if self.version_bytes is None:
                    self.version_bytes, self.version_chunks = _manifest_size(await relay.describe.remote(version))
                return
            # what of ``version`` (or newer) the relay holds in flight; a change means the chain still delivers
            mark = arrival_mark(await relay.progress.remote(), version)
            now = self._clock()
            if mark != seen:
                seen, last = mark, now
            wait_s = self._deadlines().wait_readable_s
            if now - last > wait_s:
                raise ReadableTimeout(
                    f"version {version} not committed on replica {replica_id}'s relay: no chunk arrived for "
                    f"{wait_s:.0f} s (waited {now - t0:.0f} s; newest {newest}, in flight {dict(mark)}); if the "
                    f"chain is only slow, raise {_DEADLINE_KEYS}")
            await asyncio.sleep(self._settings.poll_s)

    async def _load(self, replica_id: int, version: int) -> None:
        load_s = self._deadlines().load_s
        try:
            await asyncio.wait_for(self._load_fn(replica_id, version), load_s)
        except asyncio.TimeoutError:
            raise LoadTimeout(
                f"replica {replica_id} did not finish loading version {version} from its relay in {load_s:.0f} s; "
                f"if the load is only slow, raise laminar.refresh.min_wait_s or laminar.refresh.wait_factor"
            ) from None

    async def _newest_readable(self, replica_id: int, version: int) -> int:
        """The newest version the replica's relay holds that the trainer announced, if newer than ``version``:
        loading it instead is always right (a trajectory needs one version, not a particular one), and it is
        the one the relay will not evict next."""
        relay = self._relay_of(replica_id)
        readable = await relay.versions.remote() if relay is not None else []
        ok = [int(v) for v in readable if version < int(v) <= self._host.published()]
        return max(ok) if ok else version

    async def _load_with_retries(self, d: RefreshDecision) -> int:
        """Wait for the version (retried), then load it once; returns the version loaded (a newer one when the
        relay holds one by then).

        Only the wait is retried: nothing has reached the replica yet. A failed load is not: verl's receiver in
        the vLLM worker may have taken part of the version (or still be waiting for it), and a second transfer
        into that engine would interleave with the first, so the router stops, naming the cause."""
        rid, target, failed, host = d.replica_id, d.to_version, 0, self._host
        while True:
            try:
                await self._wait_readable(rid, target)
                break
            except Exception as e:  # noqa: BLE001 - retried or re-raised to run(), the fault boundary
                if host.closed() or not host.serves(rid) or not await host.answers(rid):
                    raise
                retries, backoff = self._settings.refresh.retries, self._settings.refresh.retry_backoff_s
                if failed >= retries:
                    raise
                failed += 1
                logger.warning("replica %d: waiting for version %d failed, attempt %d of %d (%r); retrying in "
                               "%.1f s", rid, target, failed, retries + 1, e, backoff)
                await asyncio.sleep(backoff)
        newest = target if host.exact_version(rid) else await self._newest_readable(rid, target)
        if newest != target:
            logger.info("replica %d: its relay already holds version %d; loading it instead of %d", rid, newest,
                        target)
            host.retarget(rid, newest)  # no await in between: no plan can start a second refresh of it
            target = newest
        pinned = await self._pin(rid, target)
        try:
            await self._load(rid, target)
        finally:
            if pinned:
                await self._unpin(rid, target)
        return target

    async def _pin(self, replica_id: int, version: int) -> bool:
        """Keep ``version`` on the replica's relay while it loads: a load slower than two publishes (a replacement
        starting beside another on a busy machine took 29 s) would otherwise find it evicted (keep_versions)
        and stop the run. False (a warning; the load goes on unheld) when the relay cannot hold it."""
        relay = self._relay_of(replica_id)
        if relay is None:
            return False
        try:
            if await relay.pin.remote(version):
                return True
            why = "it is not readable there any more, or /dev/shm has no room for one more copy"
        except Exception as e:  # noqa: BLE001 - the load reports a dead relay itself
            why = repr(e)
        logger.warning("replica %d: version %d not held on its relay for the load (%s)", replica_id, version, why)
        return False

    async def _unpin(self, replica_id: int, version: int) -> None:
        try:
            await self._relay_of(replica_id).unpin.remote(version)
        except Exception as e:  # noqa: BLE001 - a relay gone holds nothing
            logger.debug("replica %d: releasing version %d after its load: %r", replica_id, version, e)

    async def _drain(self, replica_id: int, t0: float) -> None:
        while self._host.inflight_on(replica_id):
            # a release is fire-and-forget and may trail finish_group by one message
            if self._clock() - t0 > self._settings.drain_timeout_s:
                raise RuntimeError(f"replica {replica_id} still has {self._host.inflight_on(replica_id)} requests "
                                   f"in flight {self._settings.drain_timeout_s} s after its batch ended")
            await asyncio.sleep(0.01)

    async def run(self, d: RefreshDecision) -> None:
        """One refresh, reported to the host as exactly one of refreshed / refresh_died / refresh_failed."""
        t0 = self._clock()
        try:
            await self._drain(d.replica_id, t0)
            loaded = await self._load_with_retries(d)
        except Exception as e:  # fault boundary: a failed load stops dispatch loudly instead of killing the loop
            try:
                dead = not self._host.serves(d.replica_id) or not await self._host.answers(d.replica_id)
            except Exception as probe:  # noqa: BLE001 - an unanswerable probe must stop dispatch, not hang it
                logger.error("replica %d: probing it after a failed refresh raised %r", d.replica_id, probe)
                dead = False
            if dead:
                self._host.refresh_died(d, e)  # failed over like any dead replica; dispatch goes on
            else:
                self._host.refresh_failed(d, e)
            return
        self._host.refreshed(d, loaded, t0, self._clock())
