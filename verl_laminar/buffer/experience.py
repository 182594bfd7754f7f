"""Experience buffer: finished trajectories in, complete prompt groups out, first completed first out.

Dataflow:
    rollout side  put(Trajectory)  -> held per group until all n responses of the group are in
                                   -> the group joins the ready FIFO (order of completion)
    trainer side  take(k, timeout) -> k complete groups, oldest completion first

Only complete groups leave: GRPO standardizes a response's reward within its group, so a partial group
would train on wrong advantages. Every put checks the one-version-per-group invariant (a violation
raises). A trajectory delivered twice is dropped and counted; a trajectory arriving for a group that was
discarded (e.g. a failed sibling) is dropped and counted; ``missing()`` lists what an expected group
still lacks, which is how a run detects lost trajectories.

A plain, thread-safe class (no Ray): the trainer blocks in ``take`` while producers ``put`` from other
threads; a Ray actor shell can wrap it unchanged.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Optional

from verl_laminar.policy.accounting import InvariantViolation

logger = logging.getLogger(__name__)


class BufferTimeout(TimeoutError):
    """``take`` waited ``timeout`` seconds without enough complete groups."""


class BufferClosed(RuntimeError):
    """The buffer was closed while a caller waited in ``take``."""


@dataclass(frozen=True, eq=False)
class Trajectory:
    key: str  # one response, unique in the run (verl: "{uid}_{session_id}")
    group_id: str  # its prompt group (verl: uid)
    group_size: int  # n: responses the group must have before it can be trained
    version: int  # weight version that generated it
    finish_s: float = 0.0
    payload: Any = None  # what the trainer needs to fetch the data (e.g. TransferQueue keys and tags)

    def __post_init__(self) -> None:
        if self.group_size < 1:
            raise ValueError(f"trajectory {self.key!r}: group_size={self.group_size} must be >= 1 (rollout.n)")


@dataclass(frozen=True)
class Group:
    group_id: str
    version: int
    trajectories: tuple[Trajectory, ...]
    completed_s: float


class PutResult(enum.Enum):
    ACCEPTED = "accepted"  # stored; its group is still incomplete
    COMPLETED_GROUP = "completed_group"  # stored and its group is now ready
    DUPLICATE = "duplicate"  # this key was delivered before: dropped
    DISCARDED_GROUP = "discarded_group"  # its group was discarded: dropped


@dataclass(frozen=True)
class BufferStats:
    accepted: int
    duplicates: int
    late_for_discarded: int
    completed_groups: int
    taken_groups: int
    discarded_groups: int
    ready_groups: int
    partial_groups: int
    wait_s_total: float


class ExperienceBuffer:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._cond = threading.Condition()
        self._partial: dict[str, list[Trajectory]] = {}
        self._ready: deque[Group] = deque()
        self._seen: set[str] = set()
        self._closed_groups: dict[str, str] = {}  # group -> "taken" | "discarded: <reason>"
        self._expected: dict[str, int] = {}
        self._accepted = self._duplicates = self._late = 0
        self._completed = self._taken = self._discarded = 0
        self._wait_s = 0.0
        self._closed = False

    # ---- producer side ----
    def expect(self, group_id: str, group_size: int) -> None:
        """Announce a dispatched group, so that ``missing()`` can report what never arrived."""
        with self._cond:
            self._expected[group_id] = group_size

    def put(self, traj: Trajectory) -> PutResult:
        with self._cond:
            if traj.key in self._seen:
                self._duplicates += 1
                logger.warning("trajectory %r delivered twice; the second copy is dropped", traj.key)
                return PutResult.DUPLICATE
            closed = self._closed_groups.get(traj.group_id)
            if closed is not None and closed != "taken":
                self._seen.add(traj.key)
                self._late += 1
                return PutResult.DISCARDED_GROUP
            if closed == "taken":
                raise InvariantViolation(f"trajectory {traj.key!r} arrived for group {traj.group_id!r}, which was "
                                         "already complete and trained: the group has more responses than group_size")
            members = self._partial.setdefault(traj.group_id, [])
            if members:
                first = members[0]
                if traj.version != first.version:
                    raise InvariantViolation(
                        f"group {traj.group_id!r} mixes versions {first.version} ({first.key!r}) and {traj.version} "
                        f"({traj.key!r}): every response of a group must come from one version")
                if traj.group_size != first.group_size:
                    raise ValueError(f"trajectory {traj.key!r} says its group has {traj.group_size} responses, "
                                     f"{first.key!r} said {first.group_size}")
            members.append(traj)
            self._seen.add(traj.key)
            self._accepted += 1
            if len(members) < traj.group_size:
                return PutResult.ACCEPTED
            del self._partial[traj.group_id]
            self._ready.append(Group(traj.group_id, traj.version, tuple(members), self._clock()))
            self._completed += 1
            self._cond.notify_all()
            return PutResult.COMPLETED_GROUP

    def discard_group(self, group_id: str, reason: str) -> int:
        """Drop a group (failed response, regeneration); returns how many of its trajectories were held."""
        with self._cond:
            if self._closed_groups.get(group_id) == "taken":
                raise InvariantViolation(f"group {group_id!r} was already trained; it cannot be discarded ({reason})")
            held = len(self._partial.pop(group_id, []))
            ready = [g for g in self._ready if g.group_id == group_id]
            for g in ready:
                self._ready.remove(g)
                held += len(g.trajectories)
            self._closed_groups[group_id] = f"discarded: {reason}"
            self._expected.pop(group_id, None)
            self._discarded += 1
            return held

    # ---- trainer side ----
    def take(self, n_groups: int, timeout: Optional[float] = None) -> list[Group]:
        """Block until ``n_groups`` complete groups are ready; return them in order of completion."""
        if n_groups < 1:
            raise ValueError(f"n_groups={n_groups} must be >= 1")
        t0 = self._clock()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while len(self._ready) < n_groups:
                if self._closed:
                    raise BufferClosed(f"buffer closed while waiting for {n_groups} groups ({len(self._ready)} ready)")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    self._wait_s += self._clock() - t0
                    raise BufferTimeout(f"{len(self._ready)} of {n_groups} groups ready after {timeout} s "
                                        f"({len(self._partial)} groups incomplete)")
                self._cond.wait(left)
            out = [self._ready.popleft() for _ in range(n_groups)]
            for g in out:
                self._closed_groups[g.group_id] = "taken"
                self._expected.pop(g.group_id, None)
            self._taken += len(out)
            self._wait_s += self._clock() - t0
            return out

    def ready(self) -> list[tuple[str, int]]:
        """(group, version) of the complete groups not yet taken, in order of completion."""
        with self._cond:
            return [(g.group_id, g.version) for g in self._ready]

    def take_ids(self, group_ids: list[str]) -> list[Group]:
        """Take these complete groups, in the order given (a staleness bound chose them: ``policy.bound``)."""
        with self._cond:
            by_id = {g.group_id: g for g in self._ready}
            missing = [g for g in group_ids if g not in by_id]
            if missing or len(set(group_ids)) != len(group_ids):
                raise InvariantViolation(f"take_ids({group_ids}): {missing or 'repeated ids'} not ready to take")
            out = [by_id[g] for g in group_ids]
            chosen = set(group_ids)
            self._ready = deque(g for g in self._ready if g.group_id not in chosen)
            for g in out:
                self._closed_groups[g.group_id] = "taken"
                self._expected.pop(g.group_id, None)
            self._taken += len(out)
            return out

    def requeue(self, groups: list[Group]) -> None:
        """Groups taken by a trainer that died before training them go back to the front, in their order."""
        with self._cond:
            for g in reversed(groups):
                if self._closed_groups.get(g.group_id) != "taken":
                    raise InvariantViolation(f"group {g.group_id!r} was not taken; it cannot be requeued")
                del self._closed_groups[g.group_id]
                self._ready.appendleft(g)
            self._taken -= len(groups)
            self._cond.notify_all()

    def close(self) -> None:
        """Wake every waiting ``take`` with ``BufferClosed`` (shutdown)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # ---- inspection ----
    def missing(self) -> dict[str, int]:
        """Expected groups not yet taken or discarded, with how many responses each still lacks."""
        with self._cond:
            ready = {g.group_id for g in self._ready}
            return {gid: n - len(self._partial.get(gid, ())) for gid, n in sorted(self._expected.items())
                    if gid not in ready}

    def stats(self) -> BufferStats:
        with self._cond:
            return BufferStats(self._accepted, self._duplicates, self._late, self._completed, self._taken,
                               self._discarded, len(self._ready), len(self._partial), self._wait_s)
