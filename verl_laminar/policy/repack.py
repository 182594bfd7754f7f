"""Repack planning: move the long tail of stragglers onto few rollouts of the same weight version.

Pure: no ray/torch/vllm/verl; works on frozen snapshots and returns a plan (a list of
``Migration``) that an executor applies. Laminar, Step 3:

1. A rollout is a *candidate* when its KV-cache utilization is falling (it has run out of queued
   work and is only finishing its tail), is below ``C_max`` and it runs fewer than ``B`` sequences
   (``B`` from the roofline, so a merged batch stays memory-bound and decodes no slower).
2. Within each group of candidates on the same weight version, best-fit bin packing: empty the
   least-used candidates first, each onto the candidate that will be fullest afterwards without
   exceeding ``C_max`` or ``B``. Emptied rollouts then fetch the newest weights.

Stability: a rollout that received sequences in the previous round is not emptied in this one,
otherwise two half-empty rollouts could trade their tails back and forth every 5 s.

Cost: sorting plus one binary search per source when the candidates of a version share a cache
size (the usual case: one rollout shape per job), so 1,024 candidates plan in a few milliseconds.
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

logger = logging.getLogger(__name__)

DEFAULT_C_MAX = 0.99  # paper: "C_max, the utilization at which the KV cache is full, about 99%"


@dataclass(frozen=True)
class RolloutSnapshot:
    """One rollout at one check: its weight version, cache use (in tokens) and sequences."""

    rollout_id: int
    version: int
    kv_tokens: int  # tokens held in the KV cache now
    kv_capacity: int  # tokens the KV cache can hold
    seq_ids: tuple[int, ...]  # running sequences (all move together when the rollout is emptied)
    waiting: int = 0  # queued requests not yet admitted
    prev_kv_used: Optional[float] = None  # utilization at the previous check; None on the first one
    kv_used: float = field(init=False)

    def __post_init__(self) -> None:
        if self.kv_capacity <= 0:
            raise ValueError(f"rollout {self.rollout_id}: kv_capacity={self.kv_capacity} must be > 0")
        if not 0 <= self.kv_tokens:
            raise ValueError(f"rollout {self.rollout_id}: kv_tokens={self.kv_tokens} must be >= 0")
        object.__setattr__(self, "kv_used", self.kv_tokens / self.kv_capacity)

    @property
    def running(self) -> int:
        return len(self.seq_ids)


@dataclass(frozen=True)
class RepackPolicy:
    c_max: float = DEFAULT_C_MAX
    max_batch: int = 256  # B: compute it with policy.roofline.compute_bound_batch

    def __post_init__(self) -> None:
        if not 0 < self.c_max <= 1:
            raise ValueError(f"c_max={self.c_max} must be in (0, 1]")
        if self.max_batch < 1:
            raise ValueError(f"max_batch={self.max_batch} must be >= 1")


@dataclass(frozen=True)
class Migration:
    """Move every running sequence of ``src`` onto ``dst``; both hold weight ``version``."""

    src: int
    dst: int
    version: int
    seq_ids: tuple[int, ...]
    kv_tokens: int


def is_candidate(snap: RolloutSnapshot, cfg: RepackPolicy) -> bool:
    """Falling, unfilled cache and a memory-bound batch: the rollout is only finishing its tail.

    The paper infers "no queued work" from the falling cache; the runtime also knows the queue
    length, and a rollout with queued requests would refill instead of emptying, so it is excluded.
    """
    if snap.prev_kv_used is None or snap.running == 0 or snap.waiting > 0:
        return False
    return snap.kv_used < snap.prev_kv_used and snap.kv_used < cfg.c_max and snap.running < cfg.max_batch


def plan_repack(snapshots: Iterable[RolloutSnapshot], cfg: RepackPolicy = RepackPolicy(),
                recent_receivers: Iterable[int] = ()) -> list[Migration]:
    """The migrations of one repack round (empty when nothing can be merged)."""
    groups: dict[int, list[RolloutSnapshot]] = {}
    for s in snapshots:
        if is_candidate(s, cfg):
            groups.setdefault(s.version, []).append(s)
    protected = frozenset(recent_receivers)
    plan: list[Migration] = []
    for version in sorted(groups):
        cands = groups[version]
        if len(cands) < 2:
            continue
        if len({s.kv_capacity for s in cands}) == 1:
            plan.extend(_pack_uniform(cands, cfg, protected))
        else:
            plan.extend(_pack_mixed(cands, cfg, protected))
    if plan:
        logger.debug("repack plan: %d migrations over %d versions", len(plan), len(groups))
    return plan


def _sources_in_order(cands: Sequence[RolloutSnapshot]) -> list[RolloutSnapshot]:
    # least-used first; ties by id so the plan is reproducible
    return sorted(cands, key=lambda s: (s.kv_tokens, s.rollout_id))


def _pack_uniform(cands: Sequence[RolloutSnapshot], cfg: RepackPolicy, protected: frozenset[int]) -> list[Migration]:
    """Best fit with one cache size: the fullest feasible target is a binary search away."""
    limit = int(cfg.c_max * cands[0].kv_capacity)
    kv = {s.rollout_id: s.kv_tokens for s in cands}
    run = {s.rollout_id: s.running for s in cands}
    # targets sorted by (kv tokens, id); every candidate starts as a possible target
    keys = sorted((s.kv_tokens, s.rollout_id) for s in cands)
    received: set[int] = set()
    out: list[Migration] = []
    for src in _sources_in_order(cands):
        sid = src.rollout_id
        if sid in protected or sid in received:
            continue  # stability, and a rollout that just took sequences this round is filling, not emptying
        own = (kv[sid], sid)
        keys.pop(bisect.bisect_left(keys, own))
        load, n = kv[sid], run[sid]
        i = bisect.bisect_right(keys, (limit - load, float("inf"))) - 1
        while i >= 0 and run[keys[i][1]] + n > cfg.max_batch:
            i -= 1  # fullest target by cache that still has room for n more sequences
        if i < 0:
            bisect.insort(keys, own)  # nothing fits: it stays, and may still receive others
            continue
        dst_kv, dst = keys.pop(i)
        kv[dst], run[dst] = dst_kv + load, run[dst] + n
        bisect.insort(keys, (kv[dst], dst))
        received.add(dst)
        out.append(Migration(sid, dst, src.version, src.seq_ids, load))
    return out


def _pack_mixed(cands: Sequence[RolloutSnapshot], cfg: RepackPolicy, protected: frozenset[int]) -> list[Migration]:
    """Best fit by utilization fraction when caches differ: a linear scan per source (rare case)."""
    kv = {s.rollout_id: s.kv_tokens for s in cands}
    run = {s.rollout_id: s.running for s in cands}
    cap = {s.rollout_id: s.kv_capacity for s in cands}
    live = {s.rollout_id for s in cands}
    received: set[int] = set()
    out: list[Migration] = []
    for src in _sources_in_order(cands):
        sid = src.rollout_id
        if sid in protected or sid in received:
            continue
        load, n = kv[sid], run[sid]
        best, best_fill = None, -1.0
        for dst in sorted(live - {sid}):
            fill = (kv[dst] + load) / cap[dst]
            if fill <= cfg.c_max and run[dst] + n <= cfg.max_batch and fill > best_fill:
                best, best_fill = dst, fill
        if best is None:
            continue
        live.discard(sid)
        kv[best], run[best] = kv[best] + load, run[best] + n
        received.add(best)
        out.append(Migration(sid, best, src.version, src.seq_ids, load))
    return out


def receivers(plan: Sequence[Migration]) -> frozenset[int]:
    """Rollouts that took sequences in ``plan``: pass them as ``recent_receivers`` next round."""
    return frozenset(m.dst for m in plan)


class KvHistory:
    """Turns a replica's stream of (version, kv tokens, sequences) readings into snapshots for the planner.

    The trend a snapshot carries (``prev_kv_used`` above or below ``kv_used``) is measured against the
    replica's peak since it last changed version or received migrated sequences, not against the
    previous reading. Why: in its tail a rollout's last sequences keep growing their caches, so
    consecutive readings can rise although the rollout is far below where it was. And when the cache is
    far from full (small batches, as on a CPU host) a long tail can even hold more cache than the whole
    batch did early on; the fall then shows in the running count first. So a replica reads as falling
    when its cache use or its running count is below its peak. A reading after a refresh (new version)
    or a receipt starts a new history.
    """

    def __init__(self) -> None:
        self._peak: dict[int, tuple[float, int]] = {}  # rollout -> (peak kv_used, peak running)
        self._version: dict[int, int] = {}

    def reset(self, rollout_id: int) -> None:
        self._peak.pop(rollout_id, None)
        self._version.pop(rollout_id, None)

    def observe(self, rollout_id: int, version: int, kv_tokens: int, kv_capacity: int,
                seq_ids: Sequence[int], waiting: int = 0) -> RolloutSnapshot:
        if self._version.get(rollout_id) != version:
            self.reset(rollout_id)
            self._version[rollout_id] = version
        seqs = tuple(seq_ids)
        used = kv_tokens / kv_capacity if kv_capacity > 0 else 0.0
        peak = self._peak.get(rollout_id)
        prev: Optional[float] = None
        if peak is not None:
            if used < peak[0] or len(seqs) < peak[1]:
                prev = max(peak[0], used + 1.0 / kv_capacity)  # falling: the reference lies above the reading
            else:
                prev = used  # at (or above) both peaks: not falling
        snap = RolloutSnapshot(rollout_id, version, kv_tokens, kv_capacity, seqs, waiting, prev_kv_used=prev)
        self._peak[rollout_id] = (max(peak[0] if peak else 0.0, used), max(peak[1] if peak else 0, len(seqs)))
        return snap
