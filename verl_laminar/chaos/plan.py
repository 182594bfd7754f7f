"""What a chaos run launches and when its process faults strike (pure; ``chaos.product`` and ``chaos.nodes``)."""

from __future__ import annotations

import random
from pathlib import Path

from verl_laminar.policy.faults import KINDS, Fault

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "cpu" / "run_laminar_grpo.sh"
FIRST_STEP = 3  # after the warm-up steps


def parse_counts(text: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        kind, sep, n = part.partition("=")
        if not sep or kind not in KINDS or not n.isdigit():
            raise ValueError(f"--faults entry {part!r}: expected KIND=N with KIND one of {', '.join(KINDS)}")
        counts[kind] = counts.get(kind, 0) + int(n)
    return counts


def plan_faults(counts: dict[str, int], seed: int, gap_steps: int, first_step: int = FIRST_STEP) -> list[Fault]:
    """The kinds in a seeded order, one every ``gap_steps`` steps from ``first_step``."""
    if gap_steps < 1:
        raise ValueError(f"--gap-steps {gap_steps}: must be >= 1")
    kinds = [k for k in KINDS for _ in range(counts.get(k, 0))]
    random.Random(seed).shuffle(kinds)
    return [Fault(first_step + i * gap_steps, kind) for i, kind in enumerate(kinds)]
