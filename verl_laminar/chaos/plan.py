"""Chaos planning and accounting (pure): a seeded fault schedule, and training throughput around each fault.

    schedule(counts, seed, ...)   -> faults in a seeded random order, separated by seeded random gaps
    throughput_report(steps, ...) -> train tokens/s before the first fault, during recoveries, and after each
                                     recovery (with its ratio to the pre-fault level)
    window_spread(segs, ...)      -> how far fault-free windows of one length stray from the level over a
                                     longer stretch: the noise floor an after-fault ratio is read against
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional, Sequence

KINDS = ("rollout", "relay", "master_relay", "pool", "trainer", "garbage")  # garbage: a replica answers bad token ids


@dataclass(frozen=True)
class PlannedFault:
    kind: str
    gap_s: float  # seconds after the previous fault recovered (the first: after warm-up)


def parse_counts(text: str) -> dict[str, int]:
    """``rollout=3,relay=1,...`` -> counts; unknown kinds and negative counts are errors."""
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        kind, _, n = part.partition("=")
        if kind not in KINDS:
            raise ValueError(f"--faults: unknown fault kind {kind!r}; kinds are {', '.join(KINDS)}")
        try:
            out[kind] = int(n)
        except ValueError:
            raise ValueError(f"--faults: {part!r} needs a count, e.g. {kind}=2") from None
        if out[kind] < 0:
            raise ValueError(f"--faults: {kind}={out[kind]} must be >= 0")
    return out


def schedule(counts: dict[str, int], seed: int, gap_s: tuple[float, float], relays: int) -> list[PlannedFault]:
    """Seeded order and gaps. Relay kills (master included) must leave at least one relay alive."""
    lo, hi = gap_s
    if not 0 <= lo <= hi:
        raise ValueError(f"gap range {gap_s} must satisfy 0 <= min <= max")
    relay_kills = counts.get("relay", 0) + counts.get("master_relay", 0)
    if relay_kills > relays - 1:
        raise ValueError(f"{relay_kills} relay kills need at least {relay_kills + 1} relays; there are {relays} "
                         "(one per rollout replica plus the trainer's)")
    if counts.get("master_relay", 0) > 1:
        # the runtime spawns no replacement relays, so a second master kill would leave the chain headless
        # faster than the schedule can be reasoned about; one master failover is the case to exercise
        raise ValueError("master_relay=1 at most in one run")
    kinds = [k for k in KINDS for _ in range(counts.get(k, 0))]
    rng = random.Random(seed)
    rng.shuffle(kinds)
    return [PlannedFault(k, rng.uniform(lo, hi)) for k in kinds]


def step_segments(steps: Sequence[tuple[float, int]], restarts: Sequence[float] = ()) -> list[tuple[float, float, int]]:
    """Each step's tokens over the time that made them: from the previous commit (or, when the trainer was
    restarted in between, from the restart: the killed process's step in progress was lost) to its commit.
    This is the paper's per-step throughput, tokens / time between two publications. The first step's
    start is unknown and it is left out."""
    steps = sorted(steps)
    segs = []
    for (tp, _), (t, tok) in zip(steps, steps[1:]):
        start = max([tp] + [r for r in restarts if tp <= r < t])
        segs.append((start, t, tok))
    return segs


def _rate(segs: Sequence[tuple[float, float, int]], t0: float, t1: float) -> Optional[float]:
    """Tokens/s over [t0, t1): each step counts for the part of its segment inside the window, so a window
    that cuts a step in two is neither rounded up nor down to whole steps."""
    if t1 - t0 <= 0:
        return None
    return _tokens_in(segs, t0, t1) / (t1 - t0)


def _tokens_in(segs: Sequence[tuple[float, float, int]], t0: float, t1: float) -> float:
    tot = 0.0
    for s0, s1, tok in segs:
        overlap = min(s1, t1) - max(s0, t0)
        if overlap > 0:
            tot += tok * overlap / (s1 - s0)
    return tot


def window_spread(segs: Sequence[tuple[float, float, int]], t0: float, t1: float, window_s: float,
                  stride_s: float = 1.0) -> Optional[dict]:
    """Rates of every ``window_s`` window sliding over [t0, t1] (no fault in it), as ratios to the rate over
    all of [t0, t1]. Steps differ in size (response lengths are skewed), so a short window of a steady system
    already strays from the long-run level; an after-fault ratio inside this spread is workload, not recovery."""
    level = _rate(segs, t0, t1)
    if not level or window_s <= 0 or t1 - t0 < window_s:
        return None
    n = int((t1 - t0 - window_s) // stride_s) + 1
    ratios = [_rate(segs, t0 + i * stride_s, t0 + i * stride_s + window_s) / level for i in range(n)]
    return {"window_s": window_s, "windows": n, "min_ratio": min(ratios), "max_ratio": max(ratios)}


def throughput_report(steps: Sequence[tuple[float, int]], faults: Sequence[tuple[str, float, float]],
                      t_end: float, min_window_s: float = 15.0, restarts: Sequence[float] = (),
                      before_from: Optional[float] = None) -> dict:
    """``steps``: (commit time, tokens); ``faults``: (kind, kill time, recovered time) in order;
    ``restarts``: when a restarted trainer process began training (see ``step_segments``).

    before: from ``before_from`` (the end of warm-up; default the first commit) to the first kill: the
    steady pre-fault level, not the start-up, when the rollouts filling the buffer slow the trainer down.
    during: over every [kill, recovered] interval.
    after each fault: from its recovery to the next kill (or the end); a window shorter than
    ``min_window_s`` holds too few steps to judge and is reported as None.
    A trainer kill destroys the step in progress: that work is the next fault's cost, not a slow window
    before it, so a window that ends at a trainer kill ends at the last commit before it.
    """
    if not steps:
        raise ValueError("no training step was committed")
    segs = step_segments(steps, restarts)
    t_first = min(t for t, _ in steps)
    commit_times = sorted(t for t, _ in steps)

    def window_end(i: int) -> float:
        """End of the window before fault ``i`` (``len(faults)``: the end of the run)."""
        if i >= len(faults):
            return t_end
        kind, kill, _ = faults[i]
        if kind != "trainer":
            return kill
        done = [t for t in commit_times if t < kill]
        return done[-1] if done else kill

    t_before = t_first if before_from is None else max(t_first, before_from)
    before = _rate(segs, t_before, window_end(0))
    during_tok = sum(_tokens_in(segs, k, r) for _, k, r in faults)
    during_s = sum(r - k for _, k, r in faults)
    after = []
    for i, (kind, _, rec) in enumerate(faults):
        end = window_end(i + 1)
        rate = _rate(segs, rec, end) if end - rec >= min_window_s else None
        after.append({"kind": kind, "window_s": end - rec, "tokens_per_s": rate,
                      "ratio_to_before": None if rate is None or not before else rate / before})
    judged = sorted(a["window_s"] for a in after if a["tokens_per_s"] is not None)
    spread = window_spread(segs, t_before, window_end(0), judged[0]) if judged else None
    return {"before": before, "during": during_tok / during_s if during_s > 0 else None, "after": after,
            "before_window_spread": spread}
