"""Per-trajectory staleness n - j, measured the way the runtime measures it.

Pure: no ray/torch/vllm/verl. A trajectory generated with weights ``theta_j`` that finishes while the
trainer holds ``theta_n`` has staleness ``n - j`` (Laminar, "Setting"). "Holds" means the last
version the trainer has published at the trajectory's finish time; the runtime reads it from the
trainer's version counter, the simulator from its list of publication times (``trainer_version_at``),
and both then call ``staleness``.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence


def staleness(generating_version: int, trainer_version_at_finish: int) -> int:
    """``n - j`` for one trajectory; negative values mean a version was mislabelled, so they raise."""
    s = trainer_version_at_finish - generating_version
    if s < 0:
        raise ValueError(
            f"trajectory generated with version {generating_version} finished while the trainer held "
            f"{trainer_version_at_finish}: a rollout cannot hold weights newer than the trainer's"
        )
    return s


def trainer_version_at(publish_times: Sequence[float], t: float, initial_version: int = 0) -> int:
    """Version held by the trainer at time ``t`` given the sorted times of its publications.

    A publication at exactly ``t`` counts as held (the runtime bumps its counter before it tells
    anyone), so a trajectory finishing at that instant is already one step older.
    """
    return initial_version + bisect.bisect_right(publish_times, t)


def histogram(values: Iterable[int]) -> dict[int, int]:
    """Count of trajectories per staleness value, every value from 0 to the max listed (zeros kept)."""
    counts = Counter(int(v) for v in values)
    if not counts:
        return {}
    if min(counts) < 0:
        raise ValueError(f"staleness values must be >= 0, got {min(counts)}")
    return {k: counts.get(k, 0) for k in range(max(counts) + 1)}


@dataclass(frozen=True)
class StalenessSummary:
    """What the paper reports about staleness: typical (mean, p50, p90) and the maximum."""

    count: int
    mean: float
    p50: int
    p90: int
    p99: int
    max: int
    hist: tuple[tuple[int, int], ...]

    def as_dict(self) -> dict:
        return {"count": self.count, "mean": round(self.mean, 4), "p50": self.p50, "p90": self.p90,
                "p99": self.p99, "max": self.max, "hist": {str(k): v for k, v in self.hist}}


def summarize(values: Iterable[int]) -> StalenessSummary:
    """Summary of per-trajectory staleness values (empty input gives an all-zero summary)."""
    h = histogram(values)
    n = sum(h.values())
    if n == 0:
        return StalenessSummary(0, 0.0, 0, 0, 0, 0, ())

    def quantile(q: float) -> int:
        # the smallest value whose cumulative count reaches q of the trajectories
        need, seen = math.ceil(q * n), 0
        for k, c in h.items():
            seen += c
            if seen >= need:
                return k
        return max(h)

    mean = sum(k * c for k, c in h.items()) / n
    return StalenessSummary(n, mean, quantile(0.5), quantile(0.9), quantile(0.99), max(h), tuple(h.items()))
