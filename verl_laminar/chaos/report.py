"""The product chaos run's report, from its launches' logs and the run's timeline file (pure parsing and arithmetic;
``chaos.product`` runs the launches).

Every Laminar log line carries its wall-clock time (``LEVEL:YYYY-mm-dd HH:MM:SS,mmm:message``); faults, deaths,
replacements and steps are read from those lines, and the per-step metrics from verl's file tracker as each launch
wrote it (``bench.launch``: ``launch<i>.metrics.jsonl``, each step stamped as it appeared; no console parsing).
"""

from __future__ import annotations

import re
import statistics
from datetime import datetime
from pathlib import Path
from typing import Any, Optional, Sequence

from verl_laminar import metrics as lm
from verl_laminar.policy.faults import Fault

_STAMP = re.compile(r"(?:DEBUG|INFO|WARNING|ERROR):(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}):(.*)$")
FAULTS = {
    "replica_kill": re.compile(r"laminar\.fault_injection: killed replica (\d+) \(SIGKILL"),
    "replica_hang": re.compile(r"laminar\.fault_injection: stopped replica (\d+) \(SIGSTOP"),
    "replica_garbage": re.compile(r"laminar\.fault_injection: replica (\d+) now answers garbage"),
    "pool_kill": re.compile(r"laminar\.fault_injection: killed the partial-response pool"),
    "trainer_kill": re.compile(r"laminar\.fault_injection: killing the trainer process"),
}
DIED = re.compile(r"^replica (\d+) died \((fenced: )?")
REPLACED = re.compile(r"laminar: replica (\d+) replaces replica (\d+): started in ([\d.]+) s")
POOL_BACK = re.compile(r"the partial-response pool answers again after ([\d.]+) s")
STEP = re.compile(r"^laminar step (\d+):")
SERVING = re.compile(r"^laminar: every replica loaded version (\d+)")
RERUN = "running it again on the group's new replica"
TOKENS = "perf/total_num_tokens"
SPANS = "training/off_policy/trajectory_spans/max"
FT_SUMS = (lm.FT_REPLICA_FAILURES, lm.FT_GROUPS_MOVED, lm.FT_GROUPS_LOST, lm.FT_GROUPS_PARKED, lm.FT_POOL_CONTINUED,
           lm.FT_POOL_CONTINUED_TOKENS, lm.FT_HUNG_REPLICAS, lm.FT_REPLACEMENTS, lm.FT_REPLACEMENTS_FAILED,
           lm.FLEET_TOKENS_WHILE_DOWN, lm.FLEET_ADOPTED, lm.FLEET_ADOPTED_TOKENS, lm.FLEET_ADOPTED_TRAINED)


def stamped(text: str) -> list[tuple[float, str]]:
    """(Unix time, message) of every Laminar log line in ``text``."""
    out = []
    for line in text.splitlines():
        m = _STAMP.search(line)
        if m:
            t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp() + int(m.group(2)) / 1000
            out.append((t, m.group(3)))
    return out


def _first(events: Sequence[tuple[float, str]], pattern: re.Pattern, after: float,
           want: Optional[str] = None) -> Optional[tuple[float, re.Match]]:
    for t, msg in events:
        m = pattern.search(msg)
        if m and t >= after and (want is None or m.group(1) == want):
            return t, m
    return None


def fault_records(events: Sequence[tuple[float, str]]) -> list[dict]:
    """Each injected fault, its time and what recovered it (and when)."""
    out = []
    for t, msg in events:
        for kind, pattern in FAULTS.items():
            m = pattern.search(msg)
            if not m:
                continue
            rec: dict[str, Any] = {"kind": kind, "t": t}
            if kind.startswith("replica_"):
                rid = m.group(1)
                rec["replica"] = int(rid)
                died = _first(events, DIED, t, rid)
                rec["detected_s"] = None if died is None else round(died[0] - t, 2)
                rec["fenced"] = bool(died and died[1].group(2))
                joined = next(((tj, mj) for tj, mj in ((tj, REPLACED.search(mj)) for tj, mj in events if tj >= t)
                               if mj and mj.group(2) == rid), None)
                rec["replacement"] = None if joined is None else int(joined[1].group(1))
                rec["recovery_s"] = None if joined is None else round(joined[0] - t, 2)
            elif kind == "pool_kill":
                back = _first(events, POOL_BACK, t)
                rec["recovery_s"] = None if back is None else float(back[1].group(1))
            else:  # the trainer: back when the rerun trains its first step (its rollouts serve a bit before)
                step = _first(events, STEP, t)
                serving = _first(events, SERVING, t)
                rec["recovery_s"] = None if step is None else round(step[0] - t, 2)
                rec["rollouts_serving_s"] = None if serving is None else round(serving[0] - t, 2)
            out.append(rec)
    return out


def step_times(launches: Sequence[dict]) -> list[tuple[float, int, float, int]]:
    """(Unix time the step line arrived, step, trained tokens, launch) of every step of every launch."""
    out = []
    for i, launch in enumerate(launches):
        rec = launch["record"]
        for s in sorted(rec.steps):
            out.append((launch["t0"] + rec.seen_s[s], s, float(rec.steps[s].get(TOKENS, 0.0)), i))
    return out


def rate(steps: Sequence[tuple[float, int, float, int]], t0: float, t1: float) -> Optional[float]:
    """Training tokens/s over the steps that ended in [t0, t1] within one launch: the tokens of all but the first
    over the time from the first to the last (None with fewer than 3 steps there)."""
    inside = [s for s in steps if t0 <= s[0] <= t1]
    if len(inside) < 3 or len({s[3] for s in inside}) > 1:
        return None
    return sum(s[2] for s in inside[1:]) / (inside[-1][0] - inside[0][0])


def effective_ratio(steps: Sequence[tuple[float, int, float, int]], t_start: float, t_end: float) -> float:
    """The share of the wall time in which training made progress that was kept: the intervals between two
    consecutive steps of one launch (every step is checkpointed, so a trainer kill discards none), over the whole
    run. Conservative: the first step of each launch is not counted (its interval holds the start-up)."""
    kept = sum(b[0] - a[0] for a, b in zip(steps, steps[1:]) if a[3] == b[3])
    return kept / (t_end - t_start) if t_end > t_start else 0.0


def build_report(plan: Sequence[Fault], steps: int, launches: Sequence[dict], t_start: float, t_end: float) -> dict:
    texts = [Path(launch["log"]).read_text(errors="replace") for launch in launches]
    events = sorted(e for text in texts for e in stamped(text))
    faults = fault_records(events)
    times = step_times(launches)
    # around each fault: the rate from the previous recovery to this fault, and from this recovery to the next fault
    marks = [(f["t"], f["t"] + (f.get("recovery_s") or 0.0)) for f in faults]
    for k, f in enumerate(faults):
        before_from = marks[k - 1][1] if k else t_start
        after_to = marks[k + 1][0] if k + 1 < len(marks) else t_end
        before, after = rate(times, before_from, f["t"]), rate(times, marks[k][1], after_to)
        f["tokens_per_s_before"], f["tokens_per_s_after"] = before, after
        f["after_over_before"] = None if not before or after is None else round(after / before, 3)
    ft = {k: 0.0 for k in FT_SUMS}
    mixed, reached = 0, 0
    for launch in launches:
        rec = launch["record"]
        if rec.steps:
            last = rec.steps[max(rec.steps)]
            for k in FT_SUMS:  # cumulative within a launch; each launch is a new trainer process
                ft[k] += float(last.get(k, 0.0))
            reached = max(reached, max(rec.steps))
        mixed += sum(1 for m in rec.steps.values() if m.get(SPANS, 1) > 1)
    recovery: dict[str, list] = {}
    for f in faults:
        recovery.setdefault(f["kind"], []).append(f.get("recovery_s"))
    ratios = [f["after_over_before"] for f in faults if f.get("after_over_before") is not None]
    return {
        "planned": [f.label() for f in plan],
        "steps": steps,
        "completed": reached >= steps,
        "launches": [{"exit_code": launch["record"].exit_code, "steps": sorted(launch["record"].steps)[:1]
                      + sorted(launch["record"].steps)[-1:]} for launch in launches],
        "faults_injected": len(faults),
        "faults": faults,
        "recovery_s": {k: v for k, v in recovery.items()},
        "duplicated": sum(text.count("InvariantViolation") for text in texts),
        "mixed_version_steps": mixed,
        # groups verl failed and refilled because no live replica served their version: their prompts were
        # replaced by new ones (the "lost"); moved groups went on, their requests from the pool or prompt
        "lost_groups": ft[lm.FT_GROUPS_LOST],
        "moved_groups": ft[lm.FT_GROUPS_MOVED],
        # of those, groups no live replica served: parked until a replacement loaded their version (lost if it failed)
        "parked_groups": ft[lm.FT_GROUPS_PARKED],
        "continued_from_pool": ft[lm.FT_POOL_CONTINUED],
        "continued_tokens": ft[lm.FT_POOL_CONTINUED_TOKENS],
        "rerun_from_prompt": sum(text.count(RERUN) for text in texts),
        "replica_failures": ft[lm.FT_REPLICA_FAILURES],
        "hung_replicas_found": ft[lm.FT_HUNG_REPLICAS],
        "replacements_joined": ft[lm.FT_REPLACEMENTS],
        "replacements_failed": ft[lm.FT_REPLACEMENTS_FAILED],
        "trained_steps": reached,
        "after_over_before_median": statistics.median(ratios) if ratios else None,
        "effective_training_time_ratio": round(effective_ratio(times, t_start, t_end), 3),
        "wall_s": round(t_end - t_start, 1),
        # laminar.fleet.detached (chaos --fleet): the replicas outlive a killed trainer; what reached the pool after
        # its last heartbeat, and the trajectories the next launch adopted from the pool and trained
        "tokens_generated_while_trainer_down": ft[lm.FLEET_TOKENS_WHILE_DOWN],
        "adopted_trajectories": ft[lm.FLEET_ADOPTED],
        "adopted_tokens": ft[lm.FLEET_ADOPTED_TOKENS],
        "adopted_trajectories_trained": ft[lm.FLEET_ADOPTED_TRAINED],
    }
