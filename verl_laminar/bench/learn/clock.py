"""One clock for every mode (pure): where it starts, what it leaves out, and when a run's budget is spent.

    t = 0   the first dispatch: the arrival of the first step's metrics (seconds since the launch, stamped by the
            launcher as the run writes them) less that step's ``timing_s/step``. In verl's sync trainer the step
            timer starts before the step's prompts are dispatched (``prepare_step``); in its asynchronous trainers
            and Laminar's the warm-up batches are dispatched in ``on_train_begin``, right before the first step's
            timer starts. So t = 0 is the first dispatch, to within the time from the step's end to its line in
            verl's file tracker plus the launcher's poll (0.2 s).
    saves   verl times a checkpoint save inside the step (``timing_s/save_checkpoint``); the clock leaves every
            save out: a step that arrives at launch time ``a_n`` is at ``a_n - t0 - (saves of steps 1..n)``.
    budget  a run ends when its clock reaches the budget: at launch time ``t0 + budget + saves so far``. Steps
            that arrive later are not counted.

Publication: step n's weights (version n) count as published when step n's metrics arrive (an upper bound: every
trainer publishes inside its step or right after it, before the metrics are logged).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

STEP_KEY = "timing_s/step"
SAVE_KEY = "timing_s/save_checkpoint"
RULE = ("t = 0 at the first dispatch: the arrival of the first step's metrics less its timing_s/step (verl's step "
        "timer starts with the dispatch in the sync trainer, right after the warm-up dispatch in the asynchronous "
        "ones); every checkpoint save (timing_s/save_checkpoint, inside the step) is subtracted from all later "
        "times; step n's weights count as published when step n's metrics arrive; a run ends when its clock "
        "reaches the budget and steps arriving later are not counted")


def start_s(steps: Mapping[int, Mapping[str, float]], seen_s: Mapping[int, float]) -> Optional[float]:
    """Launch seconds of the first dispatch, or None before the first step with its timing arrived."""
    if not steps:
        return None
    first = min(steps)
    step_s = steps[first].get(STEP_KEY)
    if step_s is None or first not in seen_s:
        return None
    return seen_s[first] - step_s


def save_s(metrics: Mapping[str, float]) -> float:
    return float(metrics.get(SAVE_KEY, 0.0) or 0.0)


@dataclass(frozen=True)
class StepTime:
    step: int
    clock_s: float  # on the benchmark's clock: since the first dispatch, saves left out
    launch_s: float  # since the launch (what the launcher stamped)


def clock_times(steps: Mapping[int, Mapping[str, float]], seen_s: Mapping[int, float]) -> list[StepTime]:
    """Every arrived step on the clock, in step order (empty before the start is known)."""
    t0 = start_s(steps, seen_s)
    if t0 is None:
        return []
    out, saved = [], 0.0
    for step in sorted(steps):
        saved += save_s(steps[step])
        if step in seen_s:
            out.append(StepTime(step, round(seen_s[step] - t0 - saved, 3), round(seen_s[step], 3)))
    return out


def within(times: list[StepTime], budget_s: float) -> list[StepTime]:
    return [s for s in times if s.clock_s <= budget_s]


def total_save_s(steps: Mapping[int, Mapping[str, float]], upto: Optional[int] = None) -> float:
    return sum(save_s(m) for s, m in steps.items() if upto is None or s <= upto)


def deadline_s(steps: Mapping[int, Mapping[str, float]], seen_s: Mapping[int, float], budget_s: float,
               grace_s: float = 1.0) -> Optional[float]:
    """Launch seconds at which the run's clock reaches the budget (None before the start is known); it moves
    later with every save that arrives."""
    t0 = start_s(steps, seen_s)
    if t0 is None:
        return None
    return t0 + budget_s + total_save_s(steps) + grace_s
