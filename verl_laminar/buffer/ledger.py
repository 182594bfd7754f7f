"""Training ledger: the experience buffer's groups leased to a trainer, and trained exactly once across restarts.

Dataflow:
    rollouts   put(Trajectory)            -> ExperienceBuffer (complete groups only leave it)
    trainer    lease(k, timeout)          -> k groups, remembered as leased (the trainer may die holding them)
    trainer    commit(step, group_ids)    -> after the step's checkpoint is on disk: the groups are trained
    restarted  recover(trained_ids)       -> the checkpoint's list is the truth: leased groups in it are
               trainer                       trained (the commit was lost with the process), the others go
                                             back to the front of the buffer and are trained by a later step
A group committed twice is counted as duplicated (and the second commit raises): the trainer's checkpoint,
not the ledger, decides what was trained, so a restart neither loses nor repeats a group.

Plain, thread-safe class (the trainer blocks in ``lease`` while rollouts ``put``); the Ray actor shell is
``ray.remote(TrainLedger).options(max_concurrency=...)`` at the spawn site.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from verl_laminar.buffer.experience import ExperienceBuffer, Group, PutResult, Trajectory
from verl_laminar.policy.accounting import InvariantViolation

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepRecord:
    step: int
    group_ids: tuple[str, ...]
    trajectories: int
    tokens: int  # response tokens
    committed_s: float
    prompt_tokens: int = 0
    timing: dict = field(default_factory=dict)  # the trainer's seconds per phase (lease wait, train, checkpoint, ...)


class TrainLedger:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._buffer = ExperienceBuffer()
        self._lock = threading.Lock()
        self._clock = clock
        self._leased: dict[str, Group] = {}
        self._trained: dict[str, int] = {}  # group -> the step that trained it
        self._steps: list[StepRecord] = []
        self.duplicated = 0
        self.requeued = 0

    # ---- rollout side ----
    def expect(self, group_id: str, group_size: int) -> None:
        self._buffer.expect(group_id, group_size)

    def put(self, traj: Trajectory) -> PutResult:
        return self._buffer.put(traj)

    def put_group(self, trajs: list[Trajectory]) -> list[PutResult]:
        return [self._buffer.put(t) for t in trajs]

    # ---- trainer side ----
    def lease(self, n_groups: int, timeout: Optional[float] = None) -> list[Group]:
        groups = self._buffer.take(n_groups, timeout)
        with self._lock:
            for g in groups:
                self._leased[g.group_id] = g
        return groups

    def commit(self, step: int, group_ids: list[str], tokens: int, prompt_tokens: int = 0,
               timing: Optional[dict] = None) -> StepRecord:
        with self._lock:
            again = [g for g in group_ids if g in self._trained]
            if again:
                self.duplicated += len(again)
                raise InvariantViolation(f"step {step} trains groups {again} that step(s) "
                                         f"{sorted({self._trained[g] for g in again})} already trained")
            unknown = [g for g in group_ids if g not in self._leased]
            if unknown:
                raise InvariantViolation(f"step {step} commits groups {unknown} that were never leased")
            n = 0
            for g in group_ids:
                n += len(self._leased.pop(g).trajectories)
                self._trained[g] = step
            rec = StepRecord(step, tuple(group_ids), n, int(tokens), self._clock(), int(prompt_tokens),
                             dict(timing or {}))
            self._steps.append(rec)
            return rec

    def recover(self, trained: dict[str, int]) -> dict[str, int]:
        """A (re)started trainer reports what its checkpoint trained; returns {"committed", "requeued"}."""
        with self._lock:
            committed = requeue = 0
            for gid, step in trained.items():
                if gid in self._leased:
                    # trained and checkpointed, but the commit died with the old process
                    g = self._leased.pop(gid)
                    self._trained[gid] = step
                    self._steps.append(StepRecord(step, (gid,), len(g.trajectories), 0, self._clock()))
                    committed += 1
            # a commit follows its checkpoint, so every committed group must be in it
            missing = sorted(g for g in self._trained if g not in trained)
            if missing:
                raise InvariantViolation(f"groups {missing[:5]} were committed but are not in the trainer's "
                                         "checkpoint: it restarted from an older checkpoint than it committed")
            back = list(self._leased.values())
            self._leased.clear()
            requeue = len(back)
            self.requeued += requeue
        if back:
            self._buffer.requeue(back)
        return {"committed": committed, "requeued": requeue}

    # ---- inspection ----
    def steps(self) -> list[StepRecord]:
        with self._lock:
            return list(self._steps)

    def trained(self) -> dict[str, int]:
        with self._lock:
            return dict(self._trained)

    def stats(self) -> dict:
        s = self._buffer.stats()
        with self._lock:
            return {"leased": len(self._leased), "trained_groups": len(self._trained), "duplicated": self.duplicated,
                    "requeued": self.requeued, "ready": s.ready_groups, "partial": s.partial_groups,
                    "duplicates_dropped": s.duplicates, "accepted": s.accepted}

    def close(self) -> None:
        self._buffer.close()
