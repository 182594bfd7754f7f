"""Repack rounds: replica readings in, a migration plan out, and the ``laminar/repack/*`` counters.

Pure of Ray and vLLM (the executor that aborts and resumes is ``rollout.repack_driver``); what it adds to
``policy.repack`` is the bookkeeping between rounds: the utilization history per replica, the
receivers of the previous round (not emptied in this one) and the metrics.

A reading is the monitor's dict for one replica (``EngineReplica.stats()`` has this shape):
``{"replica_id", "version", "kv_tokens", "kv_capacity", "running_ids", "waiting"}``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from verl_laminar import metrics as lm
from verl_laminar.policy.dispatch import DispatchError, DispatchPolicy, DispatchState, move_group
from verl_laminar.policy.repack import KvHistory, Migration, RepackPolicy, plan_repack, receivers

logger = logging.getLogger(__name__)


@dataclass
class RepackMetrics:
    rounds: int = 0
    migrations: int = 0  # replicas emptied onto another (one Migration each, so also the emptied count)
    sequences_moved: int = 0
    not_aborted: int = 0  # requests of applied moves that vLLM did not abort (they finished on the source)
    round_s: list = field(default_factory=list)  # wall seconds of rounds that moved something
    kv_used_before: list = field(default_factory=list)  # mean fleet KV use before / after each such round
    kv_used_after: list = field(default_factory=list)

    def as_dict(self) -> dict[str, float]:
        def mean(xs: Sequence[float]) -> float:
            return sum(xs) / len(xs) if xs else 0.0

        # cumulative counts; seconds and KV use are means over the rounds that moved something
        out = lm.repack_metrics(self.migrations, self.migrations, mean(self.round_s),
                                mean(self.kv_used_before) if self.kv_used_before else None,
                                mean(self.kv_used_after) if self.kv_used_after else None)
        out.update({lm.REPACK_ROUNDS: float(self.rounds), lm.REPACK_SEQUENCES: float(self.sequences_moved),
                    lm.REPACK_NOT_ABORTED: float(self.not_aborted)})
        return out


class RepackRounds:
    def __init__(self, cfg: RepackPolicy) -> None:
        self.cfg = cfg
        self.history = KvHistory()
        self._recent: frozenset[int] = frozenset()
        self.metrics = RepackMetrics()

    def plan(self, readings: Iterable[Mapping], still_taking: Iterable[int] = ()) -> list[Migration]:
        """One round. ``still_taking``: replicas the dispatcher may still give groups (not in their tail)."""
        taking = set(still_taking)
        snaps = []
        for r in readings:
            # a replica that may still receive groups is not finishing a tail: count that as queued work
            waiting = int(r.get("waiting", 0)) + (1 if r["replica_id"] in taking else 0)
            running = list(r["running_ids"])
            snaps.append(self.history.observe(int(r["replica_id"]), int(r["version"]), int(r["kv_tokens"]),
                                              int(r["kv_capacity"]), range(len(running)), waiting))
        self.metrics.rounds += 1
        plan = plan_repack(snaps, self.cfg, self._recent)
        self._recent = receivers(plan)
        for rid in self._recent:
            self.history.reset(rid)  # its cache jumps up by design; measure its next fall from the new peak
        if plan:
            used = [s.kv_used for s in snaps]
            self.metrics.kv_used_before.append(sum(used) / len(used))
        return plan

    def record(self, plan: Sequence[Migration], seconds: float, readings: Iterable[Mapping],
               not_aborted: int = 0) -> None:
        """After the executor applied ``plan`` (``readings``: the round's, before the moves): count it.
        ``not_aborted``: requests of those moves that the source's engine did not abort."""
        self.metrics.not_aborted += int(not_aborted)
        if not plan:
            return
        used = {r["replica_id"]: float(r["kv_used"]) for r in readings}
        for m in plan:
            used[m.dst] += used[m.src]
            used[m.src] = 0.0
        busy = [u for u in used.values() if u > 0]
        self.metrics.migrations += len(plan)
        self.metrics.sequences_moved += sum(len(m.seq_ids) for m in plan)
        self.metrics.round_s.append(seconds)
        self.metrics.kv_used_after.append(sum(busy) / len(busy) if busy else 0.0)
        logger.info("repack: %s in %.3f s", ", ".join(f"{m.src}->{m.dst} ({len(m.seq_ids)} seqs, v{m.version})"
                                                      for m in plan), seconds)


def apply_moves(state: DispatchState, plan: Sequence[Migration],
                cfg: DispatchPolicy) -> tuple[DispatchState, list[Migration]]:
    """Re-point each source's open groups to its target in the dispatcher state (pure).

    The plan was made from readings a moment old; a move that no longer holds is skipped: the source
    finished its batch or may take groups again, a side changed version, or the target is refreshing,
    dead or already done with its own batch. Returns the new state and the moves applied; the executor
    then aborts the applied sources' requests, which resume on their groups' new replicas.
    """
    applied = []
    for m in plan:
        src, dst = state.replica(m.src), state.replica(m.dst)
        if (m.src == m.dst or not src.open_groups or src.accepts(cfg) or src.version != m.version or dst.version != m.version
                or dst.refreshing_to is not None or not dst.alive or not dst.open_groups):
            continue
        try:
            moved = state
            for gid in sorted(src.open_groups):
                moved = move_group(moved, gid, m.dst)
        except DispatchError as e:
            logger.warning("repack: move %d -> %d skipped: %s", m.src, m.dst, e)
            continue
        state = moved
        applied.append(m)
    return state, applied
