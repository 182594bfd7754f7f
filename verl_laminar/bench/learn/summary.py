"""A run's curves and a mode's times to target (pure: numbers in, numbers out; unit-tested on records).

    steps (verl's file tracker, stamped on arrival) -> clock.clock_times -> the curve within the budget: reward
    (``critic/score/mean``), trained tokens, step times -> time to the reward target (trailing mean over a window
    of steps); held-out evaluations at the marks -> time to the held-out target; over seeds: median and spread.
"""

from __future__ import annotations

import math
import re
import statistics
from typing import Mapping, Optional, Sequence

from verl_laminar.bench.learn import clock

REWARD_KEY = "critic/score/mean"
TOKENS_KEY = "perf/total_num_tokens"
LAMINAR_HIST = re.compile(r"^laminar/staleness/hist_(\d+)$")
VERL_STALENESS = "training/off_policy/trajectory_staleness/"  # + min / mean / max, per step (verl's trainers)


def curve(steps: Mapping[int, Mapping[str, float]], seen_s: Mapping[int, float], budget_s: float) -> dict:
    """Per step that arrived within the budget: its clock time, mean training reward and trained tokens."""
    times = clock.within(clock.clock_times(steps, seen_s), budget_s)
    return {"step": [s.step for s in times], "t_s": [s.clock_s for s in times],
            "reward": [_num(steps[s.step].get(REWARD_KEY)) for s in times],
            "tokens": [_num(steps[s.step].get(TOKENS_KEY)) for s in times]}


def _num(x: Optional[float]) -> Optional[float]:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), 6)


def trailing_mean(values: Sequence[Optional[float]], window: int) -> list[Optional[float]]:
    """Mean of the last ``window`` values at each point (None until a whole window has arrived)."""
    out: list[Optional[float]] = []
    for i in range(len(values)):
        part = values[max(0, i - window + 1): i + 1]
        ok = [v for v in part if v is not None]
        out.append(round(sum(ok) / len(ok), 6) if i + 1 >= window and len(ok) == window else None)
    return out


def time_to_reward(t_s: Sequence[float], smoothed: Sequence[Optional[float]], target: float) -> Optional[float]:
    """The first clock time at which the trailing mean reward is at or above the target (None: not reached)."""
    for t, r in zip(t_s, smoothed):
        if r is not None and r >= target:
            return t
    return None


def time_to_heldout(points: Sequence[Mapping], target: float) -> Optional[float]:
    """The first mark (after t = 0) whose held-out accuracy is at or above the target (None: not reached)."""
    for p in sorted(points, key=lambda p: p["mark_s"]):
        if p["mark_s"] > 0 and p.get("accuracy") is not None and p["accuracy"] >= target:
            return p["mark_s"]
    return None


def spread(values: Sequence[Optional[float]], budget_s: float) -> dict:
    """Median and spread over seeds of a time to target; a seed that did not reach it counts as beyond the
    budget (so the median is None when half or more did not)."""
    n = len(values)
    reached = sorted(v for v in values if v is not None)
    ranked = reached + [math.inf] * (n - len(reached))
    med = statistics.median(ranked) if ranked else math.inf
    out = {"median_s": None if math.isinf(med) else round(med, 3),
           "min_s": round(reached[0], 3) if reached else None,
           "max_s": round(reached[-1], 3) if reached and len(reached) == n else None,
           "reached": len(reached), "seeds": n, "per_seed_s": list(values)}
    if len(reached) == n and n >= 4:
        q = statistics.quantiles(reached, n=4)
        out["iqr_s"] = [round(q[0], 3), round(q[2], 3)]
    if len(reached) < n:
        out["not_reached"] = f"{n - len(reached)} of {n} seeds did not reach it within the budget of {budget_s} s"
    return out


def step_times(t_s: Sequence[float]) -> dict:
    gaps = [round(b - a, 3) for a, b in zip(t_s, t_s[1:])]
    first = t_s[0] if t_s else None
    if not gaps:
        return {"first_s": first, "median_s": None, "mean_s": None, "p90_s": None, "all_s": gaps}
    ordered = sorted(gaps)
    return {"first_s": first, "median_s": round(statistics.median(gaps), 3),
            "mean_s": round(sum(gaps) / len(gaps), 3),
            "p90_s": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], "all_s": gaps}


def staleness_histogram(steps: Mapping[int, Mapping[str, float]], included: Sequence[int],
                        per_step: int) -> dict:
    """The staleness of the trained trajectories over the steps ``included``, with one definition for every mode:
    verl's lag at training time, ``training/off_policy/trajectory_staleness`` = (global_steps - 1) -
    max_global_steps (versions the trainer was ahead of the freshest weights that generated the trajectory, when
    it trained it; every v1 trainer logs it, Laminar's too). verl logs each step's min, mean and max, from which the
    histogram is exact when a step's max - min <= 1 (its ``per_step`` trajectories split between two values by the
    mean) and otherwise split between min and max keeping the mean (counted in ``inexact_steps``).

    Laminar's own ``n - j`` (publications while the trajectory was generated, not counting its time in the buffer:
    docs/async.md) is kept beside it from its per-step ``laminar/staleness/hist_<k>`` (None for verl's trainers)."""
    hist: dict[int, int] = {}
    own: dict[int, int] = {}
    inexact = 0
    for s in included:
        m = steps.get(s, {})
        for key, value in m.items():
            hit = LAMINAR_HIST.match(key)
            if hit:
                own[int(hit.group(1))] = own.get(int(hit.group(1)), 0) + int(value)
        lo, mean, hi = (m.get(VERL_STALENESS + k) for k in ("min", "mean", "max"))
        if lo is None or mean is None or hi is None:
            continue
        lo, hi = int(round(lo)), int(round(hi))
        n_hi = 0 if hi == lo else int(round((mean - lo) / (hi - lo) * per_step))
        n_hi = max(0, min(per_step, n_hi))
        inexact += hi - lo > 1
        hist[lo] = hist.get(lo, 0) + per_step - n_hi
        if n_hi:
            hist[hi] = hist.get(hi, 0) + n_hi
    return {"histogram": {str(k): hist[k] for k in sorted(hist)},
            "source": f"{VERL_STALENESS}min/mean/max" if hist else None, "inexact_steps": inexact,
            "laminar_n_minus_j": {str(k): own[k] for k in sorted(own)} if own else None}


def add_histograms(hists: Sequence[Mapping[str, int]]) -> dict[str, int]:
    total: dict[int, int] = {}
    for h in hists:
        for k, v in h.items():
            total[int(k)] = total.get(int(k), 0) + int(v)
    return {str(k): total[k] for k in sorted(total)}


def run_summary(seed: int, steps: Mapping[int, Mapping[str, float]], seen_s: Mapping[int, float], budget_s: float,
                window: int, per_step: int, targets: Mapping[str, float], heldout: Sequence[Mapping],
                ended_by: str, exit_code: Optional[int], prompts: Optional[Mapping] = None) -> dict:
    """One (mode, seed) run: what the result's ``modes.<mode>.seeds`` holds."""
    c = curve(steps, seen_s, budget_s)
    smooth = trailing_mean(c["reward"], window)
    included = c["step"]
    tokens = sum(t for t in c["tokens"] if t is not None)
    t0 = clock.start_s(steps, seen_s)
    stale = staleness_histogram(steps, included, per_step)
    return {
        "seed": seed, "ended_by": ended_by, "exit_code": exit_code,
        "first_dispatch_after_launch_s": None if t0 is None else round(t0, 3),
        "steps": len(included), "steps_after_budget": len([s for s in steps if s not in set(included)]),
        "checkpoint_saves_s": round(clock.total_save_s(steps, included[-1] if included else 0), 3),
        "curve": {**c, "reward_smoothed": smooth},
        "heldout": list(heldout),
        "trained_tokens": tokens, "tokens_per_s": round(tokens / budget_s, 3) if budget_s > 0 else None,
        "step_time_s": step_times(c["t_s"]),
        "staleness_histogram": stale["histogram"], "staleness_source": stale["source"],
        "staleness_inexact_steps": stale["inexact_steps"],
        "laminar_staleness_n_minus_j": stale["laminar_n_minus_j"],
        "prompts": dict(prompts or {}),
        "time_to_reward_target_s": time_to_reward(c["t_s"], smooth, targets["reward"]),
        "time_to_heldout_target_s": time_to_heldout(heldout, targets["heldout"]),
    }


def mode_summary(runs: Sequence[Mapping], budget_s: float, place: Mapping, overrides: Sequence[str]) -> dict:
    """A mode over its seeds: the result's ``modes.<mode>``."""
    runs = sorted(runs, key=lambda r: r["seed"])
    return {
        "placement": dict(place), "overrides": list(overrides),
        "seeds": list(runs),
        "prompt_fingerprint": {str(r["seed"]): r.get("prompts", {}).get("sha256") for r in runs},
        "time_to_reward_target_s": spread([r["time_to_reward_target_s"] for r in runs], budget_s),
        "time_to_heldout_target_s": spread([r["time_to_heldout_target_s"] for r in runs], budget_s),
        "staleness_histogram": add_histograms([r["staleness_histogram"] for r in runs]),
        "laminar_staleness_n_minus_j": (add_histograms([r["laminar_staleness_n_minus_j"] or {} for r in runs])
                                        if any(r.get("laminar_staleness_n_minus_j") for r in runs) else None),
    }


REQUIRED_MODE_KEYS = ("seeds", "prompt_fingerprint", "time_to_reward_target_s", "time_to_heldout_target_s",
                      "staleness_histogram")


def shape_problems(result: Mapping) -> list[str]:
    """What the result lacks of the committed shape (empty: it has it all)."""
    problems = []
    modes, targets = result.get("modes"), result.get("targets")
    if not isinstance(modes, dict) or not modes:
        problems.append("top-level 'modes' must be a non-empty object keyed by mode name")
        modes = {}
    for name, m in modes.items():
        for key in REQUIRED_MODE_KEYS:
            if key not in m:
                problems.append(f"modes.{name} lacks '{key}'")
        if not isinstance(m.get("seeds"), list) or not m.get("seeds"):
            problems.append(f"modes.{name}.seeds must be a non-empty list (one entry per seed)")
        for key in ("time_to_reward_target_s", "time_to_heldout_target_s"):
            if isinstance(m.get(key), dict) and not {"median_s", "min_s", "max_s"} <= set(m[key]):
                problems.append(f"modes.{name}.{key} needs median_s, min_s and max_s")
    if not isinstance(targets, dict) or not {"reward", "heldout", "rule"} <= set(targets):
        problems.append("top-level 'targets' must hold 'reward', 'heldout' and their 'rule'")
    return problems
