"""Load one weight version into one rollout replica, without touching any other replica.

verl has no call for this (its ``CheckpointEngineManager.update_weights`` aborts and syncs every replica);
its pieces do: each ``CheckpointEngineWorker.update_weights(global_steps)`` of the replica reads the version
from this machine's relay and pushes it into the vLLM engine, then labels the server with ``global_steps``.
The router calls this only for an idle replica (its batch ended, nothing in flight), so no abort/resume.

Dataflow of one refresh (``ReplicaRefresh._refresh``, mixed into ``rollout.router.LaminarRouter``):
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
from typing import Any, Optional, Sequence

from verl_laminar.policy.dispatch import (
    DispatchPlan,
    RefreshDecision,
    abandon_refresh,
    apply_plan,
    complete_refresh,
)
from verl_laminar.policy.timeouts import RefreshDeadlines, arrival_mark, chunk_count, refresh_deadlines

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


class ReplicaRefresh:
    """Needs from the router: _relays, _refresh_settings, _chain_relays, _version_bytes, _version_chunks,
    _poll_s, _state, _cfg, _replicas, _refresher, _inflight, _drain_timeout_s, _published, _closed, _clock,
    _alive, _fail, _pump, _waiters, _events, _loading_parked, _adopt_parked and the refresh counters."""

    def _deadlines(self) -> RefreshDeadlines:
        return refresh_deadlines(self._version_bytes, self._chain_relays, self._refresh_settings,
                                 self._version_chunks)

    async def _arrival(self, relay: Any, version: int) -> tuple:
        """What of ``version`` (or newer) the relay holds in flight; a change means the chain still delivers."""
        return arrival_mark(await relay.progress.remote(), version)

    async def _wait_readable(self, replica_id: int, version: int) -> None:
        """The trainer's publish returns before the relay has committed the version. A load must not start
        earlier: a failed read after verl's weight-transfer handshake leaves the vLLM receiver out of step.
        A large version takes minutes down the chain, so the wait fails only once no chunk arrived for a
        whole deadline, not after a fixed time."""
        relay = self._relays.get(replica_id)
        if relay is None:
            return
        t0 = last = self._clock()
        seen: Optional[tuple] = None
        while True:
            newest = await relay.newest.remote()
            if newest is not None and newest >= version:
                if self._version_bytes is None:
                    self._version_bytes, self._version_chunks = _manifest_size(
                        await relay.describe.remote(version))
                return
            mark = await self._arrival(relay, version)
            now = self._clock()
            if mark != seen:
                seen, last = mark, now
            wait_s = self._deadlines().wait_readable_s
            if now - last > wait_s:
                raise ReadableTimeout(
                    f"version {version} not committed on replica {replica_id}'s relay: no chunk arrived for "
                    f"{wait_s:.0f} s (waited {now - t0:.0f} s; newest {newest}, in flight {dict(mark)}); if the "
                    f"chain is only slow, raise {_DEADLINE_KEYS}")
            await asyncio.sleep(self._poll_s)

    async def _load(self, replica_id: int, version: int) -> None:
        load_s = self._deadlines().load_s
        try:
            await asyncio.wait_for(self._refresher(self._replicas[replica_id], version), load_s)
        except asyncio.TimeoutError:
            raise LoadTimeout(
                f"replica {replica_id} did not finish loading version {version} from its relay in {load_s:.0f} s; "
                f"if the load is only slow, raise laminar.refresh.min_wait_s or laminar.refresh.wait_factor"
            ) from None

    async def _newest_readable(self, replica_id: int, version: int) -> int:
        """The newest version the replica's relay holds that the trainer announced, if newer than ``version``:
        loading it instead is always right (a trajectory needs one version, not a particular one), and it is
        the one the relay will not evict next."""
        relay = self._relays.get(replica_id)
        readable = await relay.versions.remote() if relay is not None else []
        ok = [int(v) for v in readable if version < int(v) <= self._published]
        return max(ok) if ok else version

    def _retarget(self, replica_id: int, version: int) -> None:
        """Point the replica's refresh at ``version`` (no await in between: no pump can plan a second one)."""
        self._state = abandon_refresh(self._state, replica_id)
        r = self._state.replica(replica_id)
        self._state = apply_plan(self._state, DispatchPlan(refreshes=(RefreshDecision(
            replica_id, r.version, version),)), self._cfg)

    async def _load_with_retries(self, d: RefreshDecision) -> int:
        """Wait for the version (retried), then load it once; returns the version loaded (a newer one when the
        relay holds one by then).

        Only the wait is retried: nothing has reached the replica yet. A failed load is not: verl's receiver in
        the vLLM worker may have taken part of the version (or still be waiting for it), and a second transfer
        into that engine would interleave with the first, so the router stops, naming the cause."""
        rid, target, failed = d.replica_id, d.to_version, 0
        while True:
            try:
                await self._wait_readable(rid, target)
                break
            except Exception as e:  # noqa: BLE001 - retried or re-raised to _refresh, the fault boundary
                if self._closed or not self._state.replica(rid).alive or not await self._alive(rid):
                    raise
                retries, backoff = self._refresh_settings.retries, self._refresh_settings.retry_backoff_s
                if failed >= retries:
                    raise
                failed += 1
                logger.warning("replica %d: waiting for version %d failed, attempt %d of %d (%r); retrying in "
                               "%.1f s", rid, target, failed, retries + 1, e, backoff)
                await asyncio.sleep(backoff)
        # a load for parked groups needs their version, not the newest
        newest = target if rid in self._loading_parked else await self._newest_readable(rid, target)
        if newest != target:
            logger.info("replica %d: its relay already holds version %d; loading it instead of %d", rid, newest,
                        target)
            self._retarget(rid, newest)
            target = newest
        await self._load(rid, target)
        return target

    async def _drain(self, replica_id: int, t0: float) -> None:
        while self._inflight[replica_id]:
            # a release is fire-and-forget and may trail finish_group by one message
            if self._clock() - t0 > self._drain_timeout_s:
                raise RuntimeError(f"replica {replica_id} still has {self._inflight[replica_id]} requests "
                                   f"in flight {self._drain_timeout_s} s after its batch ended")
            await asyncio.sleep(0.01)

    async def _refresh(self, d: RefreshDecision) -> None:
        t0 = self._clock()
        try:
            await self._drain(d.replica_id, t0)
            loaded = await self._load_with_retries(d)
        except Exception as e:  # fault boundary: a failed load stops dispatch loudly instead of killing the loop
            if not self._state.replica(d.replica_id).alive or not await self._alive(d.replica_id):
                # the replica died while loading: it is failed over like any dead replica, dispatch goes on
                logger.error("refresh of replica %d to version %d failed: the replica is dead (%r)",
                             d.replica_id, d.to_version, e)
                self._fail(d.replica_id, f"died while loading version {d.to_version}: {e!r}")
                return
            self._state = abandon_refresh(self._state, d.replica_id)
            if self._closed:
                logger.info("refresh of replica %d stopped by close: %r", d.replica_id, e)
                return
            logger.error("refresh of replica %d to version %d failed: %r", d.replica_id, d.to_version, e)
            self._error = e
            for fut in self._waiters.values():
                if not fut.done():
                    fut.set_exception(RuntimeError(f"refresh of replica {d.replica_id} failed: {e!r}"))
            self._waiters.clear()
            return
        t1 = self._clock()
        if not self._state.replica(d.replica_id).alive:
            return  # it was failed over while loading (its refreshing_to was cleared then)
        self._state = complete_refresh(self._state, d.replica_id, loaded)
        self._adopt_parked(d.replica_id, loaded)  # groups of a dead replica waiting for this version
        self._rollout_wait_s += t1 - t0
        self._refreshes += 1
        # (replica, version, finished, started, previous version): the first three are what the ledger needs,
        # the last two give the report's timeline the whole load interval (t0 includes the drain and the wait
        # for the relay: the replica serves nothing from t0 on)
        self._events["versions"].append((d.replica_id, loaded, t1, t0, d.from_version))
        logger.info("replica %d: version %d -> %d in %.2f s", d.replica_id, d.from_version, loaded, t1 - t0)
        self._pump()
