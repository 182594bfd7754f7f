"""Failover policy: replica health from heartbeats, and where a dead replica's trajectories continue.

Pure: no ray/torch/vllm/verl. The runtime feeds heartbeat timestamps and the orphaned prompt groups (from the
partial-response pool); this module decides, the runtime executes. Rules (paper "Fault tolerance"):

1. Health: a replica whose last heartbeat is older than ``suspect_after_s`` is suspect (takes no new group,
   keeps what it has); older than ``dead_after_s`` it is dead and its groups are orphaned.
2. A prompt group moves as a whole, so its n responses keep one weight version (GRPO normalises rewards
   within a group), and only to an ALIVE replica serving exactly the group's version; among those, the least
   loaded after earlier moves of the same plan (balanced).
3. No such replica: while the group is younger than ``max_age_s`` and a relay still holds its version, a
   replacement replica is started on that version (one per version, however many groups wait for it);
   otherwise the group is regenerated from its prompt with the newest weights, and counted as regenerated.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

FIRST_TOKEN_FACTOR = 3.0  # a replica that streamed no token yet is hung after this many dead_after_s of busy silence


class Health(str, enum.Enum):
    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"


@dataclass(frozen=True)
class HeartbeatPolicy:
    interval_s: float = 1.0
    dead_after_s: float = 5.0

    def __post_init__(self) -> None:
        if not 0 < self.interval_s < self.dead_after_s:
            raise ValueError(f"heartbeat interval_s={self.interval_s} must be > 0 and below dead_after_s="
                             f"{self.dead_after_s} (laminar.heartbeat.*); a usual pair is 1.0 and 5.0")

    @property
    def first_token_after_s(self) -> float:
        # a replica that streamed no token yet (a replacement's first requests on a cold engine, or every replica
        # after a pool restart) gets longer: a cold first forward at nice 19 on busy cores was seen to take over 10 s
        return FIRST_TOKEN_FACTOR * self.dead_after_s

    @property
    def ping_after_s(self) -> float:
        # an idle replica's server answers a ping from its event loop; at nice 19 on busy cores it may wait for the
        # scheduler, so a stopped process is told from a slow one only after as long as a cold first token
        return FIRST_TOKEN_FACTOR * self.dead_after_s

    @property
    def suspect_after_s(self) -> float:
        # two missed beats: one late beat on a loaded host is normal
        return min(2.0 * self.interval_s, self.dead_after_s)

    def health(self, last_beat_s: float, now_s: float) -> Health:
        silent = now_s - last_beat_s
        if silent >= self.dead_after_s:
            return Health.DEAD
        if silent >= self.suspect_after_s:
            return Health.SUSPECT
        return Health.ALIVE


def fleet_health(last_beats: Mapping[int, float], now_s: float, policy: HeartbeatPolicy) -> dict[int, Health]:
    return {rid: policy.health(t, now_s) for rid, t in last_beats.items()}


def hung_replicas(busy_for_s: Mapping[int, float], silent_for_s: Mapping[int, float],
                  policy: HeartbeatPolicy) -> list[int]:
    """Replicas that hold requests and make no progress: busy without a break for at least ``dead_after_s``
    (``busy_for_s``: seconds since the replica last had no request in flight; absent: idle now) and no token
    or new request of theirs reached the pool for as long (``silent_for_s``). A replica absent from
    ``silent_for_s`` has streamed no token yet (a new replica, or any after a pool restart): it is hung only
    once busy for ``first_token_after_s``. The token stream is the heartbeat: a replica whose server answers
    calls while its engine is stuck is hung all the same, and an idle replica streams nothing without being
    hung."""
    def hung(rid: int, busy: float) -> bool:
        if rid not in silent_for_s:
            return busy >= policy.first_token_after_s
        return busy >= policy.dead_after_s and silent_for_s[rid] >= policy.dead_after_s

    return sorted(rid for rid, busy in busy_for_s.items() if hung(rid, busy))


def unanswered_replicas(ping_waits_s: Mapping[int, float], policy: HeartbeatPolicy) -> list[int]:
    """Idle replicas whose server has left a ping unanswered for ``ping_after_s``: stopped between batches (a
    hung replica with no request in flight streams nothing, so the silence rule above cannot see it)."""
    return sorted(rid for rid, wait in ping_waits_s.items() if wait >= policy.ping_after_s)


@dataclass(frozen=True)
class OrphanGroup:
    group_id: str
    version: int
    trajectories: int  # responses of the group (all move together)
    started_s: float


@dataclass(frozen=True)
class ReplicaView:
    replica_id: int
    version: int
    health: Health
    load: int  # trajectories it is generating now


@dataclass(frozen=True)
class FailoverPlan:
    moves: tuple[tuple[str, int], ...]  # (group, replica): continue there from the pool, same version
    replacements: tuple[tuple[int, tuple[str, ...]], ...]  # (version, groups waiting for a new replica on it)
    regenerate: tuple[str, ...]  # groups restarted from the prompt with the newest weights

    @property
    def group_ids(self) -> set[str]:
        return {g for g, _ in self.moves} | {g for _, gs in self.replacements for g in gs} | set(self.regenerate)


def plan_failover(orphans: Sequence[OrphanGroup], replicas: Iterable[ReplicaView], now_s: float,
                  relay_versions: Iterable[int], max_age_s: float) -> FailoverPlan:
    """Decide for every orphaned group: move (same version), wait for a replacement, or regenerate.

    Every orphan appears in exactly one of the three outcomes; oldest groups are placed first so the
    trajectories closest to done get the least loaded replicas.
    """
    if max_age_s < 0:
        raise ValueError(f"max_age_s={max_age_s} must be >= 0")
    ids = [o.group_id for o in orphans]
    if len(set(ids)) != len(ids):
        raise ValueError(f"an orphaned group appears twice: {sorted(g for g in set(ids) if ids.count(g) > 1)}")
    load = {r.replica_id: r.load for r in replicas if r.health is Health.ALIVE}
    version_of = {r.replica_id: r.version for r in replicas if r.health is Health.ALIVE}
    kept = set(relay_versions)
    moves: list[tuple[str, int]] = []
    waiting: dict[int, list[str]] = {}
    regenerate: list[str] = []
    for o in sorted(orphans, key=lambda o: (o.started_s, o.group_id)):
        same = [rid for rid, v in version_of.items() if v == o.version]
        if same:
            target = min(same, key=lambda rid: (load[rid], rid))
            load[target] += o.trajectories
            moves.append((o.group_id, target))
        elif now_s - o.started_s <= max_age_s and o.version in kept:
            waiting.setdefault(o.version, []).append(o.group_id)
        else:
            regenerate.append(o.group_id)
    return FailoverPlan(tuple(moves), tuple((v, tuple(gs)) for v, gs in sorted(waiting.items())), tuple(regenerate))
