"""The router's books for ``laminar.buffer.max_staleness`` (``policy.bound``): the training groups finished and not
yet trained, the last step the trainer sampled, and from them the admission floor and limit and each step's batch.

The router is the one place that sees every group start and finish, so the trainer asks it which of its finished
groups to train (``LaminarRouter.plan_batch``); choosing and forgetting them happen in one call on the router's event
loop, so admission never counts a group the trainer already took.
"""

from __future__ import annotations

import logging
from typing import Iterable, Mapping, Optional, Sequence

from verl_laminar.policy.bound import StalenessBound, lag
from verl_laminar.policy.dispatch import Assignment
from verl_laminar.rollout.books import GroupBook

logger = logging.getLogger(__name__)


class BoundBook:
    def __init__(self, k: Optional[int], per_step: Optional[int]) -> None:
        self.bound = StalenessBound(k)
        if self.bound.on and (per_step is None or int(per_step) < 1):
            raise ValueError(f"laminar.buffer.max_staleness={k} needs the groups each step trains (data."
                             f"train_batch_size), got {per_step!r}")
        self.per_step = int(per_step or 1)
        self.untrained: dict[str, int] = {}  # finished training groups the trainer has not taken: group -> version
        self.sampled: Optional[int] = None  # the last step whose batch the trainer took
        self.overdue = 0  # groups trained beyond the bound (only a restart's restored backlog can cause them)
        # groups the trainer took before their finish_group reached the router: verl writes a group's finished
        # status to its TransferQueue inside the agent loop, before the loop's own finish_group call, so the trainer
        # can train a group first. Such a group must not become untrained afterwards (it would be pending forever:
        # the trainer would wait for it and admission would count its slot, a hang), nor count while its pin is open
        self.taken: set[str] = set()

    def next_step(self, published: int) -> int:
        """The step the trainer samples next: it samples step s after publishing s - 1."""
        return max(int(published) + 1, (self.sampled or 0) + 1)

    def finished(self, group_id: str, pin: Optional[Assignment], groups: GroupBook) -> None:
        """A group ends: a training group whose every response finished waits for the trainer (``plan``)."""
        if group_id in self.taken:  # already trained (see ``taken``)
            self.taken.discard(group_id)
            return
        if self.bound.on and pin is not None and group_id not in groups.validate and group_id in groups.complete():
            self.untrained[group_id] = int(pin.version)

    def _open(self, pins: Mapping[str, Assignment], skip: Iterable[str]) -> list[int]:
        skip = set(skip)
        return [a.version for g, a in pins.items() if g not in skip]

    def admission(self, pins: Mapping[str, Assignment], validate: set[str],
                  published: int) -> tuple[Optional[int], Optional[int]]:
        versions = self._open(pins, validate | self.taken) + list(self.untrained.values())
        return self.bound.admission(self.next_step(published), int(published), self.per_step, versions)

    def plan(self, step: int, ready: Sequence[tuple[str, int]], pins: Mapping[str, Assignment],
             validate: set[str], dropped: Iterable[str] = (), size: Optional[int] = None) -> Optional[list[str]]:
        """The ``size`` groups (default: a step's) step ``step`` trains among ``ready`` (the trainer's complete
        groups), or None to wait. ``dropped``: finished groups the trainer will never take (their prompts failed)."""
        for g in dropped:
            self.untrained.pop(g, None)
        ready = [(str(g), int(v)) for g, v in ready]
        have = {g for g, _ in ready}
        pending = (self._open(pins, validate | have | self.taken)
                   + [v for g, v in self.untrained.items() if g not in have])
        chosen = self.bound.choose(int(step), ready, pending, int(size or self.per_step))
        if chosen is None:
            return None
        versions = dict(ready)
        late = [g for g in chosen if self.bound.on and lag(step, versions[g]) > self.bound.k]
        if late:
            self.overdue += len(late)
            logger.warning("laminar: step %d trains %d groups beyond max_staleness=%s (a restored backlog): %s",
                           step, len(late), self.bound.k, late[:5])
        for g in chosen:
            if self.untrained.pop(g, None) is None and self.bound.on and g in pins:
                self.taken.add(g)  # chosen while its finish_group is still to come
        self.sampled = max(int(step), self.sampled or 0)
        return chosen
