"""Dispatcher policy: which replica generates which prompt group, and when a replica refreshes.

Pure: no ray/torch/vllm/verl; frozen dataclasses in, plans out. The runtime router and the simulator
apply the same functions. Laminar's rules (paper "Setting", Step 1, Step 5):

1. A prompt group (all n responses of one prompt) goes to one replica, so every response of the group
   comes from one weight version: GRPO standardizes rewards within the group, which assumes one policy.
2. A replica takes at most ``groups_per_batch`` groups per batch. Its batch ends when every group it
   took has finished, and only then may it load newer weights. The cap is what keeps staleness small:
   a replica that kept taking work would never be idle, so it would never refresh.
3. Every request of a group (each turn of a multi-turn agent loop, each of the n responses) is routed
   to the group's replica and only while that replica still serves the group's version. Anything else
   raises: a silent re-route would mix versions inside a trajectory.

Replica lifecycle:
    serving(v, open groups) --batch ends, newer version available--> refreshing(v -> w)
    refreshing(v -> w) --complete_refresh--> serving(w, no groups)

Plan, then apply: ``plan_dispatch`` returns a ``DispatchPlan`` (refreshes + assignments) that the
runtime executes and then commits with ``apply_plan``; ``finish_group``/``complete_refresh`` feed
events back. A plan made from an outdated state is rejected by ``apply_plan``, never half applied.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import MappingProxyType
from typing import AbstractSet, Iterable, Mapping, Optional, Sequence, Union


class DispatchError(RuntimeError):
    """A plan or event that contradicts the dispatcher state (the message names both)."""


class RoutingError(DispatchError):
    """A request that would run on a replica not serving its group's version."""


@dataclass(frozen=True)
class DispatchPolicy:
    groups_per_batch: int  # prompt groups one replica takes per batch (a share of a training step)

    def __post_init__(self) -> None:
        if self.groups_per_batch < 1:
            raise ValueError(
                f"groups_per_batch={self.groups_per_batch} must be >= 1; a usual value is "
                "ceil(train_batch_size / number of rollout replicas)"
            )


@dataclass(frozen=True)
class ReplicaState:
    replica_id: int
    version: int  # weights the replica serves now
    open_groups: frozenset[str] = frozenset()  # groups of the current batch not yet finished
    taken: int = 0  # groups taken in the current batch; reset when the batch ends
    refreshing_to: Optional[int] = None  # set while new weights load; the replica takes nothing then
    alive: bool = True

    @property
    def batch_ended(self) -> bool:
        return not self.open_groups

    def accepts(self, cfg: DispatchPolicy) -> bool:
        return self.alive and self.refreshing_to is None and self.taken < cfg.groups_per_batch


@dataclass(frozen=True)
class Assignment:
    """Group ``group_id`` runs on ``replica_id`` with weight ``version``, every request and every turn."""

    group_id: str
    replica_id: int
    version: int


@dataclass(frozen=True)
class RefreshDecision:
    """Replica ``replica_id`` loads ``to_version`` (newer than ``from_version``) before taking work."""

    replica_id: int
    from_version: int
    to_version: int


@dataclass(frozen=True)
class DispatchPlan:
    refreshes: tuple[RefreshDecision, ...] = ()
    assignments: tuple[Assignment, ...] = ()
    waiting: tuple[str, ...] = ()  # groups no replica can take now, in queue order


@dataclass(frozen=True)
class DispatchState:
    replicas: tuple[ReplicaState, ...]  # sorted by replica_id
    pins: Mapping[str, Assignment] = dataclasses.field(default_factory=lambda: MappingProxyType({}))

    def replica(self, replica_id: int) -> ReplicaState:
        for r in self.replicas:
            if r.replica_id == replica_id:
                return r
        raise DispatchError(f"unknown replica {replica_id}; known: {[r.replica_id for r in self.replicas]}")

    def versions(self) -> dict[int, int]:
        return {r.replica_id: r.version for r in self.replicas}


def initial_state(replica_ids: Iterable[int], version: int) -> DispatchState:
    """Every replica serves ``version`` (the weights loaded at start) and holds no group."""
    ids = sorted(set(replica_ids))
    if not ids:
        raise ValueError("the dispatcher needs at least one replica")
    return DispatchState(tuple(ReplicaState(i, version) for i in ids))


def _with(state: DispatchState, replica: ReplicaState, pins: Optional[dict] = None) -> DispatchState:
    reps = tuple(replica if r.replica_id == replica.replica_id else r for r in state.replicas)
    return DispatchState(reps, MappingProxyType(pins) if pins is not None else state.pins)


def decide_refresh(replica: ReplicaState, newest_available: Optional[int]) -> Optional[RefreshDecision]:
    """Refresh only a live, idle replica (its batch ended) when a strictly newer version is available."""
    if not replica.alive or replica.refreshing_to is not None or not replica.batch_ended:
        return None
    if newest_available is None or newest_available <= replica.version:
        return None
    return RefreshDecision(replica.replica_id, replica.version, newest_available)


def _newest_for(newest: Union[int, Mapping[int, int], None], replica_id: int) -> Optional[int]:
    # A mapping gives what each replica's machine-local relay holds; the chain may not have reached all.
    if newest is None or isinstance(newest, int):
        return newest
    return newest.get(replica_id)


def plan_dispatch(state: DispatchState, queue: Sequence[str], newest: Union[int, Mapping[int, int], None],
                  cfg: DispatchPolicy, floor: Optional[int] = None, limit: Optional[int] = None,
                  exempt: AbstractSet[str] = frozenset()) -> DispatchPlan:
    """Refresh idle replicas that are behind, then hand queued groups (FIFO) to replicas with room.

    A group goes to the accepting replica with the newest version (fresher data), then the one that took
    the fewest groups this batch (spread the load), then the lowest id (deterministic plans). ``floor``: a
    replica serving an older version takes nothing, and ``limit`` groups are assigned at most (the staleness bound,
    ``policy.bound``); groups in ``exempt`` (validation, never trained) are held to neither.
    """
    if len(set(queue)) != len(queue):
        raise DispatchError(f"queue holds a group twice: {sorted(g for g in set(queue) if queue.count(g) > 1)}")
    pinned = [g for g in queue if g in state.pins]
    if pinned:
        raise DispatchError(f"groups {pinned[:5]} are already assigned; finish_group them before re-queueing")
    refreshes = tuple(d for r in state.replicas if (d := decide_refresh(r, _newest_for(newest, r.replica_id))))
    refreshing = {d.replica_id for d in refreshes}
    room = {r.replica_id: r for r in state.replicas if r.accepts(cfg) and r.replica_id not in refreshing}
    taken = {rid: r.taken for rid, r in room.items()}
    assignments: list[Assignment] = []
    waiting: list[str] = []
    bounded = 0
    for group in queue:
        held = group not in exempt
        open_ids = [rid for rid in room if taken[rid] < cfg.groups_per_batch
                    and not (held and floor is not None and room[rid].version < floor)]
        if not open_ids or (held and limit is not None and bounded >= limit):
            waiting.append(group)
            continue
        rid = min(open_ids, key=lambda i: (-room[i].version, taken[i], i))
        taken[rid] += 1
        bounded += held
        assignments.append(Assignment(group, rid, room[rid].version))
    return DispatchPlan(refreshes, tuple(assignments), tuple(waiting))


def apply_plan(state: DispatchState, plan: DispatchPlan, cfg: DispatchPolicy) -> DispatchState:
    """Commit a plan; raises ``DispatchError`` (and changes nothing) if it no longer fits the state."""
    pins = dict(state.pins)
    reps = {r.replica_id: r for r in state.replicas}
    for d in plan.refreshes:
        r = reps.get(d.replica_id)
        if r is None or decide_refresh(r, d.to_version) != d:
            raise DispatchError(f"refresh {d} does not fit replica state {r}: plan again from the current state")
        reps[d.replica_id] = dataclasses.replace(r, refreshing_to=d.to_version)
    for a in plan.assignments:
        r = reps.get(a.replica_id)
        if a.group_id in pins:
            raise DispatchError(f"group {a.group_id!r} is already assigned to {pins[a.group_id]}")
        if r is None or not r.accepts(cfg) or r.version != a.version:
            raise DispatchError(f"assignment {a} does not fit replica state {r}: plan again from the current state")
        reps[a.replica_id] = dataclasses.replace(r, open_groups=r.open_groups | {a.group_id}, taken=r.taken + 1)
        pins[a.group_id] = a
    return DispatchState(tuple(reps[i] for i in sorted(reps)), MappingProxyType(pins))


def route(state: DispatchState, group_id: str) -> Assignment:
    """Where a request of ``group_id`` (any response, any turn) must run; raises instead of re-routing."""
    a = state.pins.get(group_id)
    if a is None:
        raise RoutingError(f"group {group_id!r} has no assignment; dispatch it (plan_dispatch) before generating")
    r = state.replica(a.replica_id)
    if not r.alive:
        raise RoutingError(f"group {group_id!r} is pinned to dead replica {r.replica_id}; move it (move_group) to a "
                           f"live replica serving version {a.version}")
    if r.version != a.version or r.refreshing_to is not None:
        raise RoutingError(f"group {group_id!r} needs version {a.version} but replica {r.replica_id} serves "
                           f"{r.version} (refreshing_to={r.refreshing_to}): a refresh ran under an open group")
    return a


def finish_group(state: DispatchState, group_id: str) -> tuple[DispatchState, bool]:
    """Mark every response of ``group_id`` done; returns the new state and whether its replica's batch ended."""
    a = state.pins.get(group_id)
    if a is None:
        raise DispatchError(f"finish_group({group_id!r}): the group is not assigned (finished twice, or never "
                            "dispatched)")
    r = state.replica(a.replica_id)
    left = r.open_groups - {group_id}
    # the batch ends with its last group: the slots reset, and the replica may now refresh
    r = dataclasses.replace(r, open_groups=left, taken=r.taken if left else 0)
    pins = dict(state.pins)
    del pins[group_id]
    return _with(state, r, pins), not left


def complete_refresh(state: DispatchState, replica_id: int, version: int) -> DispatchState:
    r = state.replica(replica_id)
    if r.refreshing_to != version:
        raise DispatchError(f"replica {replica_id} finished loading version {version} but was refreshing to "
                            f"{r.refreshing_to}")
    return _with(state, dataclasses.replace(r, version=version, refreshing_to=None, taken=0))


def abandon_refresh(state: DispatchState, replica_id: int) -> DispatchState:
    """A load failed (e.g. the version left the relay): keep serving the old version; plan again."""
    r = state.replica(replica_id)
    if r.refreshing_to is None:
        raise DispatchError(f"replica {replica_id} is not refreshing")
    return _with(state, dataclasses.replace(r, refreshing_to=None))


def move_group(state: DispatchState, group_id: str, to_replica: int) -> DispatchState:
    """Move an unfinished group (repack, failover) to another replica serving the same version.

    The group does not use a batch slot on the target: targets are replicas finishing their own tail.
    """
    a = state.pins.get(group_id)
    if a is None:
        raise DispatchError(f"move_group({group_id!r}): the group is not assigned")
    src, dst = state.replica(a.replica_id), state.replica(to_replica)
    if dst.replica_id == src.replica_id:
        return state
    if not dst.alive or dst.refreshing_to is not None or dst.version != a.version:
        raise RoutingError(f"cannot move group {group_id!r} (version {a.version}) to replica {to_replica} "
                           f"(version {dst.version}, alive={dst.alive}, refreshing_to={dst.refreshing_to}); "
                           "pick a live replica serving the same version")
    left = src.open_groups - {group_id}
    src = dataclasses.replace(src, open_groups=left, taken=src.taken if left else 0)
    dst = dataclasses.replace(dst, open_groups=dst.open_groups | {group_id})
    pins = dict(state.pins)
    pins[group_id] = Assignment(group_id, to_replica, a.version)
    return _with(_with(state, src), dst, pins)


def close_batch(state: DispatchState, replica_id: int, cfg: DispatchPolicy) -> DispatchState:
    """The replica takes no new group until its open ones finish (a replacement that loaded an old version for a
    dead replica's groups serves only those, then refreshes to the newest)."""
    r = state.replica(replica_id)
    return _with(state, dataclasses.replace(r, taken=max(r.taken, cfg.groups_per_batch)))


def mark_dead(state: DispatchState, replica_id: int) -> DispatchState:
    """A dead replica takes nothing; its groups stay pinned until failover moves them."""
    return _with(state, dataclasses.replace(state.replica(replica_id), alive=False, refreshing_to=None))


def add_replica(state: DispatchState, replica_id: int, version: int) -> DispatchState:
    """A new replica joins (a replacement after a failure) serving ``version``; it holds no group yet."""
    if any(r.replica_id == replica_id for r in state.replicas):
        raise DispatchError(f"replica {replica_id} is already known; a replacement needs a new id")
    reps = tuple(sorted(state.replicas + (ReplicaState(replica_id, version),), key=lambda r: r.replica_id))
    return DispatchState(reps, state.pins)
