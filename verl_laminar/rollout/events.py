"""What the router tells the trainer: typed events, each defined once here, drained once per training step.

The router (and its failover component) append events as they happen on the router's monotonic clock; the trainer
drains them (``LaminarRouter.drain_events``) into the ledger, the fault-tolerance counters and the timeline. The
drained batch, ``RouterEvents``, carries the router's ``clock`` pair (its monotonic time and Unix time when drained)
so that a trainer on another node can turn router times into wall-clock times (``timeline.RouterClock``).

Every event is a frozen dataclass (pickled by Ray between the router actor and the trainer); ``EventLog.add``
refuses anything else, so no dict or tuple event can reappear.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union


@dataclass(frozen=True)
class Started:
    """One response of a group was assigned a replica and a version (``replica_id`` is ``ADOPTED_REPLICA`` for a
    group answered from the partial-response pool after a trainer restart)."""

    key: str  # "<group>_<i>"
    group_id: str
    replica_id: int
    version: int


@dataclass(frozen=True)
class Finished:
    """One response finished; ``n`` is the trainer's published version then, so its staleness is ``n - version``."""

    key: str
    group_id: str
    replica_id: int
    version: int
    start_s: Optional[float]  # the agent-loop worker's clock (maybe another node); a fallback only
    finish_s: float  # router clock
    assigned_s: Optional[float]  # router clock: when the group got its replica
    prompt_tokens: int
    response_tokens: int
    n: int


@dataclass(frozen=True)
class Loaded:
    """A replica finished loading ``version``; it served ``from_version`` before and nothing from ``start_s`` on
    (the drain and the wait for its relay are part of the load)."""

    replica_id: int
    version: int
    finish_s: float
    start_s: float
    from_version: int


@dataclass(frozen=True)
class Violation:
    """A rollout worker saw an invariant broken (the trainer stops the run on it)."""

    message: str


@dataclass(frozen=True)
class ReplicaDied:
    """A replica died (``replica_id``), or, with ``followup``, the groups its death parked were lost later."""

    replica_id: Optional[int]
    t: float
    error: str
    moved: tuple[tuple[str, int], ...]  # (group, live replica of its version it moved to)
    lost: tuple[tuple[str, int], ...]  # (group, responses): no live replica serves its version; verl refills
    lost_validation: tuple[str, ...]  # validation groups lost (not in the trainer's ledger)
    complete: tuple[str, ...]  # groups whose every response had finished: nothing to move
    parked: tuple[str, ...]  # groups waiting for the replacement to load their version
    followup: bool = False


@dataclass(frozen=True)
class ParkedAdopted:
    """``replica_id`` loaded ``version`` and took the groups a dead replica's death parked on it."""

    replica_id: int
    version: int
    groups: tuple[str, ...]
    t: float


@dataclass(frozen=True)
class Continued:
    """A dead replica's request continued on its group's new replica from ``tokens`` streamed to the pool."""

    group_id: str
    request_id: str
    tokens: int


RouterEvent = Union[Started, Finished, Loaded, Violation, ReplicaDied, ParkedAdopted, Continued]
EVENT_TYPES = (Started, Finished, Loaded, Violation, ReplicaDied, ParkedAdopted, Continued)


@dataclass(frozen=True)
class RouterEvents:
    """One drain: every event since the previous drain, by kind, in the order they happened."""

    clock: tuple[float, float]  # (router monotonic time, Unix time) at the drain: no default, no guessed times
    started: tuple[Started, ...] = ()
    finished: tuple[Finished, ...] = ()
    loaded: tuple[Loaded, ...] = ()
    violations: tuple[Violation, ...] = ()
    failures: tuple[ReplicaDied, ...] = ()
    adopted: tuple[ParkedAdopted, ...] = ()
    continued: tuple[Continued, ...] = ()


_FIELD = {Started: "started", Finished: "finished", Loaded: "loaded", Violation: "violations",
          ReplicaDied: "failures", ParkedAdopted: "adopted", Continued: "continued"}


class EventLog:
    """The router's events since the last drain."""

    def __init__(self) -> None:
        self._items: dict[str, list] = {name: [] for name in _FIELD.values()}

    def add(self, event: RouterEvent) -> None:
        name = _FIELD.get(type(event))
        if name is None:
            raise TypeError(f"{type(event).__name__} is not a router event; the events are "
                            f"{', '.join(t.__name__ for t in EVENT_TYPES)} (rollout.events)")
        self._items[name].append(event)

    def drain(self, clock: tuple[float, float]) -> RouterEvents:
        items, self._items = self._items, {name: [] for name in _FIELD.values()}
        return RouterEvents(**{name: tuple(v) for name, v in items.items()}, clock=(float(clock[0]), float(clock[1])))
