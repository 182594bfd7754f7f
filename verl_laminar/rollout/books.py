"""What the router's loop keeps beside the dispatch state: its replicas (handles, relays, requests in flight) and
its groups (size, responses finished, when each got its replica). The router owns both; its components (failover,
refresh, repack) are handed the book they need, not the router.

The dispatch state itself (``policy.dispatch.DispatchState``) is immutable policy state: only the router commits
a new one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from verl_laminar.policy.adopt import ADOPTED_REPLICA
from verl_laminar.policy.dispatch import Assignment, RoutingError

UNLOADED = -1  # version of a replica before its first refresh: it takes no group until it has v0


@dataclass(frozen=True)
class ReplicaHandles:
    replica_id: int
    address: str  # verl's server id for the balancer protocol
    server: Any  # the vLLMHttpServer actor handle requests go to
    workers: tuple = ()  # the replica's CheckpointEngineWorker handles (what a refresh calls)


# key of the chain's master relay in ``ReplicaBook.relays``: holds go to it too. It lives on the trainer's machine,
# not with a rollout machine that may be lost, and a relay that joins later (``relay.catch_up``) takes a held
# version from it; before, a version held only on a cut machine's relay could be pulled from nowhere.
CHAIN_MASTER = -1


@dataclass
class ReplicaBook:
    """Every replica the fleet ever had (dead ones stay: their address still names them in late releases)."""

    handles: dict[int, ReplicaHandles] = field(default_factory=dict)
    by_address: dict[str, int] = field(default_factory=dict)
    relays: dict[int, Any] = field(default_factory=dict)  # replica -> its machine-local relay actor
    inflight: dict[int, int] = field(default_factory=dict)
    requests: dict[int, set[str]] = field(default_factory=dict)  # vLLM request ids in flight

    @classmethod
    def of(cls, replicas: Sequence[ReplicaHandles], relays: Optional[dict] = None) -> "ReplicaBook":
        book = cls(relays=dict(relays or {}))
        for r in replicas:
            book.join(r)
        return book

    def join(self, replica: ReplicaHandles, relay: Any = None) -> None:
        rid = int(replica.replica_id)
        if rid in self.handles or replica.address in self.by_address:
            raise RoutingError(f"replica {rid} at {replica.address} is already in the fleet; a replacement needs a "
                               "new rank and server")
        self.handles[rid] = replica
        self.by_address[replica.address] = rid
        self.inflight[rid] = 0
        self.requests[rid] = set()
        if relay is not None:
            self.relays[rid] = relay

    def acquire(self, replica_id: int, request_id: str) -> ReplicaHandles:
        self.inflight[replica_id] += 1
        self.requests[replica_id].add(request_id)
        return self.handles[replica_id]

    def release(self, address: str, request_id: Optional[str]) -> None:
        rid = self.by_address[address]
        self.inflight[rid] = max(0, self.inflight[rid] - 1)
        self.requests[rid].discard(request_id)

    def forget_requests(self, replica_id: int) -> None:
        """A dead replica: its requests fail on their own; late releases find nothing to count down."""
        self.inflight[replica_id] = 0
        self.requests[replica_id].clear()

    def total_inflight(self) -> int:
        return sum(self.inflight.values())


@dataclass
class GroupBook:
    """The groups the router handed out (or adopted) and has not finished."""

    n: dict[str, int] = field(default_factory=dict)  # responses the group asks for
    finished: dict[str, int] = field(default_factory=dict)  # responses finished (trajectory_finished calls)
    assigned_s: dict[str, float] = field(default_factory=dict)  # when it got its replica (oldest move first)
    validate: set[str] = field(default_factory=set)  # validation groups: not in the trainer's ledger
    adopted: dict[str, Assignment] = field(default_factory=dict)  # answered from the pool, on no replica

    def adopt(self, group_id: str, n: int, version: int, published: int, now: float) -> Assignment:
        """Pin a re-issued group whose whole responses the pool holds (``policy.adopt``) to their version."""
        if version > published:
            raise RoutingError(f"group {group_id!r} adopted at version {version}, above the published {published}: "
                               "a discarded branch's responses")
        a = self.adopted[group_id] = Assignment(group_id, ADOPTED_REPLICA, int(version))
        self.n[group_id], self.assigned_s[group_id] = int(n), now
        return a

    def complete(self) -> set[str]:
        """Groups whose every response has been generated (still open while rewarded and stored)."""
        return {g for g, done in self.finished.items() if done >= self.n.get(g, done + 1)}

    def sized(self, groups: Sequence[str]) -> list[tuple[str, int]]:
        """(group, size) of the training groups among ``groups`` (what the trainer's ledger counts as lost)."""
        return [(g, self.n.get(g, 0)) for g in groups if g not in self.validate]

    def validation(self, groups: Sequence[str]) -> list[str]:
        return [g for g in groups if g in self.validate]

    def forget(self, group_id: str) -> None:
        self.n.pop(group_id, None)
        self.finished.pop(group_id, None)
        self.assigned_s.pop(group_id, None)
        self.validate.discard(group_id)
