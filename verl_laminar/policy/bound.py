"""``laminar.buffer.max_staleness = k``: every trained trajectory has staleness n - j <= k, by admission and by the
trainer waiting, never by dropping finished work (dropping the slow rollouts would bias learning toward short answers).

Pure: no ray/torch/vllm/verl. Staleness is fixed when a trajectory finishes (``policy.staleness``: n is the version
the trainer has published then), so the bound holds if no version j + k + 1 is published while a group of version j
is open. Two rules keep it:

1. Admission (``floor``): a replica takes a new group only while it serves a version >= the floor, which is the
   published version minus k, or, while the trainer waits to publish version v, v minus k. A replica below the floor
   finishes its open groups, its batch ends, and it refreshes to the newest version before it takes more.
2. The trainer's wait (``blockers``): before it publishes version v, the trainer waits until no open training group
   has a version below v - k. Rule 1 admits none of those meanwhile, so the wait ends when they finish.

k = 0 is synchronous training: the trainer publishes once every group of the previous version finished, and a replica
takes groups only at the version the trainer holds. Groups answered from the pool after a trainer restart
(``policy.adopt``) are adopted only if their version is within k of the published one; older ones are generated again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet, Mapping, Optional

from verl_laminar.policy.dispatch import Assignment


@dataclass(frozen=True)
class StalenessBound:
    k: Optional[int] = None  # None: staleness is measured, not bounded

    def __post_init__(self) -> None:
        if self.k is not None and (isinstance(self.k, bool) or int(self.k) != self.k or self.k < 0):
            raise ValueError(f"laminar.buffer.max_staleness={self.k!r}: must be null (measured, not bounded) or an "
                             "integer >= 0")

    @property
    def on(self) -> bool:
        return self.k is not None

    def floor(self, published: Optional[int], publishing: Optional[int] = None) -> Optional[int]:
        """The oldest version a replica may serve to take a new group (None: any)."""
        if self.k is None or published is None:
            return None
        return (published if publishing is None else max(int(publishing), published)) - self.k

    def blockers(self, pins: Mapping[str, Assignment], version: int,
                 skip: AbstractSet[str] = frozenset()) -> list[Assignment]:
        """The open groups that would finish more than k versions behind once ``version`` is published (oldest
        first); ``skip``: groups that are not trained (validation)."""
        if self.k is None:
            return []
        return sorted((a for g, a in pins.items() if g not in skip and a.version < version - self.k),
                      key=lambda a: (a.version, a.group_id))

    def adoptable(self, version: int, published: int) -> bool:
        """Whether finished work of ``version`` may be trained after ``published`` without exceeding the bound."""
        return self.k is None or published - version <= self.k
