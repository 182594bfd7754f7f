"""Repack's executor in the router's loop: read the replicas' KV use, plan a round, abort the moved requests.

A component of ``rollout.router.LaminarRouter``, given a narrow ``RepackHost``: the replicas it may read, the vLLM
request ids in flight on each, which replicas still take groups, and the one state change a round makes (the host
applies the moves to its dispatch state). Dataflow of one round (every ``interval_s``, and after each publication):
    read each live, not refreshing replica's vLLM /metrics (``reader``) -> ``RepackRounds.plan`` -> host.apply_moves
    -> abort the sources' requests (their pinned clients see the aborted output, ask ``take_migrated`` and resume
    on the target with prompt + partial response, same version, remaining budget) -> ``RepackRounds.record``
    -> host.pump (the emptied replicas' batches ended: they refresh and take new groups)
A failed read skips the round: repack is an optimisation, never a reason to stop.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol

from verl_laminar.policy.repack import RepackPolicy
from verl_laminar.rollout.repack import RepackRounds

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RepackSettings:
    """``laminar.repack`` as the router uses it: how often to plan, and the planner's bounds (B resolved)."""

    policy: RepackPolicy
    interval_s: float = 5.0


class RepackHost(Protocol):
    def repack_candidates(self) -> list[tuple[Any, int]]: ...  # (ReplicaHandles, version): live, not refreshing
    def requests_on(self, replica_id: int) -> set[str]: ...  # the live set of vLLM ids in flight there
    def taking(self) -> set[int]: ...  # replicas still taking groups (not in their tail)
    def apply_repack(self, plan: list) -> list: ...  # the moves applied to the dispatch state
    def closed(self) -> bool: ...
    def pump(self) -> None: ...


class RepackDriver:
    def __init__(self, host: RepackHost, rounds: RepackRounds, interval_s: float,
                 reader: Optional[Callable[[str], Any]], clock: Callable[[], float]) -> None:
        self._host, self._rounds, self.interval_s = host, rounds, interval_s
        self._reader, self._clock = reader, clock
        self._migrated: set[str] = set()
        self._lock = asyncio.Lock()
        self._task: Optional[asyncio.Task] = None

    @property
    def started(self) -> bool:
        return self._task is not None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def metrics(self) -> dict:
        return self._rounds.metrics.as_dict()

    def take_migrated(self, request_id: str) -> bool:
        """Was this (aborted) request taken off its replica by repack? Asked once per aborted request."""
        if request_id in self._migrated:
            self._migrated.discard(request_id)
            return True
        return False

    async def _loop(self) -> None:
        while not self._host.closed():
            await asyncio.sleep(self.interval_s)
            try:
                await self.round()
            except Exception:  # noqa: BLE001 - a failed round must not end repack for the rest of the run
                logger.exception("repack round failed; the next one runs in %.1f s", self.interval_s)

    async def _read(self, replica: Any) -> Any:
        from verl_laminar.rollout import vllm_metrics
        return await asyncio.to_thread(self._reader or vllm_metrics.read, replica.address)

    async def round(self) -> None:
        if self._host.closed():
            return
        async with self._lock:
            live = self._host.repack_candidates()
            try:
                got = await asyncio.gather(*(self._read(r) for r, _ in live))
            except Exception as e:  # noqa: BLE001 - logged, the next round tries again
                logger.warning("repack: reading vLLM metrics failed, round skipped: %r", e)
                return
            readings = [{"replica_id": r.replica_id, "version": v, "kv_tokens": g.kv_tokens,
                         "kv_capacity": g.kv_capacity_tokens, "running_ids": sorted(self._host.requests_on(
                             r.replica_id)), "waiting": g.waiting, "kv_used": g.kv_used}
                        for (r, v), g in zip(live, got)]
            plan = self._rounds.plan(readings, self._host.taking())
            if not plan:
                return
            t0 = self._clock()
            applied = self._host.apply_repack(plan)
            servers = {r.replica_id: r.server for r, _ in live}
            aborts = []
            for m in applied:
                vids = sorted(self._host.requests_on(m.src))
                self._migrated.update(vids)
                aborts.append((m.src, vids))
            left = await asyncio.gather(*(self._abort(servers[rid], rid, vids) for rid, vids in aborts))
            self._rounds.record(applied, self._clock() - t0, readings, not_aborted=sum(left))
            self._host.pump()

    async def _abort(self, server: Any, replica_id: int, vids: list, settle_s: float = 5.0) -> int:
        """Abort each request; one acquired but not yet admitted by vLLM is retried until it is (or ends).
        Returns how many could not be aborted (they finish on this replica)."""
        pending = set(vids)
        deadline = self._clock() + settle_s
        while pending:
            for vid in sorted(pending):
                if vid not in self._host.requests_on(replica_id):
                    pending.discard(vid)  # it finished (released) before the abort reached it:
                    self._migrated.discard(vid)  # its client will not ask
                    continue
                res = await server.abort_request.remote(vid, reset_prefix_cache=False)
                if res.get("aborted"):
                    pending.discard(vid)
            if pending and self._clock() > deadline:
                logger.warning("repack: %d requests on replica %d could not be aborted; they finish there (vLLM "
                               "did not find their ids: is VLLM_DISABLE_REQUEST_ID_RANDOMIZATION=1 set for the "
                               "rollout servers? +laminar=enabled sets it)", len(pending), replica_id)
                self._migrated.difference_update(pending)
                return len(pending)
            if pending:
                await asyncio.sleep(0.05)
        return 0
