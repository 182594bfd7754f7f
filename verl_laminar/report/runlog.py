"""A run's steps and their summary (pure: no processes, no Ray; unit-tested on records).

A ``RunRecord`` holds each step's metrics and the time it arrived (seconds since launch; the time between two steps
is the wall time between two weight publications, the paper's step time). The runs fill it from structured files:
verl's file tracker followed by ``bench.launch`` (``report.tracker_file``), or the Laminar trainer's step file
(``from_step_file``). ``parse_step_line`` reads verl's console lines (``step:N - key:value - ...``, a value maybe a
numpy repr such as ``np.float64(2.0)``) only for run directories saved before those files existed.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Union

from verl_laminar import metrics as lm

_STEP = re.compile(r"\bstep:(\d+) - (.*)$")
_NUMPY = re.compile(r"^np\.\w+\((.*)\)$")
STALENESS_HIST = re.compile("^" + re.escape(lm.STALENESS_HIST_PREFIX) + r"(\d+)$")
VIOLATION = "InvariantViolation"
IN_FLIGHT_DONE = 0.5  # the share of an in-flight trajectory counted as generated (see buffer_change)


def _number(text: str) -> Optional[float]:
    text = text.strip()
    m = _NUMPY.match(text)
    if m:
        text = m.group(1)
    try:
        return float(text)
    except ValueError:
        return None


# "(TaskRunnerV1 pid=600)" with Ray's colour codes around it: the actor a console line came from
_PREFIX = re.compile(r"^((?:\x1b\[\d+m)?\(\S+ pid=\d+\)(?:\x1b\[0m)?) ?(.*)$")


def parse_step_line(line: str) -> Optional[tuple[int, dict[str, float]]]:
    """``(step, metrics)`` of one console line, or None when it is not a step line."""
    m = _STEP.search(line.rstrip("\n"))
    if m is None:
        return None
    metrics: dict[str, float] = {}
    for item in m.group(2).split(" - "):
        key, sep, value = item.partition(":")
        if not sep:
            continue
        number = _number(value)
        if number is not None:
            metrics[key.strip()] = number
    return int(m.group(1)), metrics


@dataclass
class RunRecord:
    """What one recipe run trained, step by step, with each step's arrival time (seconds since launch)."""

    name: str
    steps: dict[int, dict[str, float]] = field(default_factory=dict)
    seen_s: dict[int, float] = field(default_factory=dict)
    violations: int = 0
    exit_code: Optional[int] = None
    _open: Optional[tuple[str, str]] = field(default=None, repr=False)  # the last step line: (actor prefix, text)

    def add_step(self, step: int, metrics: dict[str, float], t: float) -> None:
        """One step from a structured file (verl's file tracker, a step file), ``t`` seconds after the launch."""
        self.steps.setdefault(step, {}).update(metrics)
        self.seen_s.setdefault(step, t)

    def note_line(self, line: str) -> None:
        """A console line of the run, read for one thing only: the ledger's error name (no metric comes from it)."""
        if VIOLATION in line:
            self.violations += 1

    def feed(self, line: str, t: float) -> None:
        """A console line of a saved log written before the runs kept their steps in a file (the report's fallback
        for older run directories; the launcher reads the file, ``bench.launch``)."""
        self.note_line(line)
        parsed = parse_step_line(line)
        if parsed is None and self._open is not None:
            # Ray's log monitor sometimes breaks a long line in two, each part under the actor's prefix: the second
            # part of a step line is joined to the first (mid-token, as it was cut)
            prefix, text = self._open
            m = _PREFIX.match(line)
            if m is not None and m.group(1) == prefix and " - " in m.group(2):
                self._open = None
                parsed = parse_step_line(text + m.group(2))
        self._open = None
        if parsed is not None:
            step, metrics = parsed
            self.steps[step] = metrics
            self.seen_s.setdefault(step, t)
            m = _PREFIX.match(line)
            if m is not None:
                self._open = (m.group(1), line.rstrip("\n"))

    def feed_all(self, lines: Iterable[tuple[float, str]]) -> "RunRecord":
        for t, line in lines:
            self.feed(line, t)
        return self

    @classmethod
    def from_step_file(cls, name: str, path: Union[str, Path], last_run_only: bool = False,
                       started: Optional[float] = None) -> "RunRecord":
        """The steps a run wrote to its step file (``verl_laminar.stepfile``), no console needed. ``last_run_only``:
        only the last (re)start's steps (a resumed run appends to its predecessor's file). ``seen_s`` is each
        step's time since ``started`` (Unix seconds; default the first step's run start is unknown, so the first
        step read counts as 0)."""
        from verl_laminar.stepfile import read_step_file

        lines = read_step_file(path)
        if last_run_only and lines:
            lines = [s for s in lines if s.run == lines[-1].run]
        rec = cls(name)
        t0 = started if started is not None else (lines[0].t if lines else 0.0)
        for s in lines:
            rec.steps[s.step] = dict(s.metrics)
            rec.seen_s[s.step] = s.t - t0
        return rec


def _mean(values: list[float]) -> Optional[float]:
    return sum(values) / len(values) if values else None


def summarise(run: RunRecord, skip: int = 1) -> dict:
    """Steady-state throughput over steps ``skip+1..N``: their tokens over the wall time from the end of
    step ``skip`` to the end of step N (the first step carries engine warm-up and, for an asynchronous
    trainer, the pipeline fill; both systems are measured the same way), less what an asynchronous trainer's
    buffer held at the window's start beyond what it held at its end (``buffer_change``)."""
    steps = sorted(run.steps)
    out: dict = {"name": run.name, "exit_code": run.exit_code, "steps": len(steps),
                 "invariant_violations": run.violations}
    if len(steps) <= skip:
        out["error"] = f"only {len(steps)} step(s) finished; need more than {skip} to measure a steady state"
        return out
    window = steps[skip:]
    first, last = steps[skip - 1], steps[-1]
    tokens = sum(run.steps[s].get("perf/total_num_tokens", math.nan) for s in window)
    wall = run.seen_s[last] - run.seen_s[first]
    buffer = buffer_change(run, first, last, tokens)
    generated = tokens - buffer["drained_tokens_est"] if buffer else tokens
    out.update(
        window_steps=[window[0], window[-1]],
        trained_tokens=tokens,
        window_wall_s=wall,
        tokens_per_s=generated / wall if wall > 0 else None,
        startup_s=run.seen_s[steps[0]],
        step_wall_s=[run.seen_s[b] - run.seen_s[a] for a, b in zip(steps, steps[1:])],
        score_mean=[run.steps[s].get("critic/score/mean") for s in steps],
        response_length_mean=[run.steps[s].get("response_length/mean") for s in steps],
        response_length_max=[run.steps[s].get("response_length/max") for s in steps],
    )
    if buffer:
        out["buffer"] = buffer
        out["tokens_per_s_trained"] = tokens / wall if wall > 0 else None
    timing: dict[str, Optional[float]] = {}
    for key in ("timing_s/step", "timing_s/gen", "timing_s/old_log_prob", "timing_s/update_actor",
                "timing_s/update_weights", lm.TRAINER_WAIT, lm.ROLLOUT_WAIT):
        timing[key] = _mean([run.steps[s][key] for s in window if key in run.steps[s]])
    out["mean_per_step_s"] = {k: v for k, v in timing.items() if v is not None}
    hist: dict[int, int] = {}
    for s in steps:
        for key, value in run.steps[s].items():
            m = STALENESS_HIST.match(key)
            if m:
                hist[int(m.group(1))] = hist.get(int(m.group(1)), 0) + int(value)
    if hist:
        out["staleness_hist"] = {str(k): hist[k] for k in sorted(hist)}
        out["staleness_max"] = max(k for k, v in hist.items() if v > 0) if any(hist.values()) else 0
        checked = [run.steps[s].get(lm.INVARIANT_CHECKED) for s in steps]
        out["checked_trajectories"] = max((c for c in checked if c is not None), default=0)
    return out


def buffer_change(run: RunRecord, first: int, last: int, tokens: float) -> Optional[dict]:
    """How much of a window's training was generated before it: an asynchronous trainer that starts the window
    with finished, untrained trajectories in its buffer and ends it with fewer trains work the window did not
    generate, so its trained tokens over the window's wall time overstate what the system sustains (by 30 % in
    an 8-step run with 4 batches ahead). The steady-state rate counts what the window generated: the trained
    tokens less the drained trajectories: the finished ones with the tokens the trainer logs for them
    (``laminar/trajectories/finished_tokens``; logs older than that metric: the window's mean per trajectory). None
    for a trainer that reports no buffer (verl's sync trainer has none).

    In-flight trajectories count half: their partial work is not logged, and a trajectory caught in flight is on
    average half done. Without them a run that starts the window with 12 in flight and ends it with 4 would be
    credited with their earlier half."""
    at = [run.steps[s] for s in (first, last)]
    keys = (lm.TRAJECTORIES_FINISHED, lm.TRAJECTORIES_TRAINED, lm.TRAJECTORIES_IN_FLIGHT)
    if not all(k in m for m in at for k in keys):
        return None
    trained = at[1][lm.TRAJECTORIES_TRAINED] - at[0][lm.TRAJECTORIES_TRAINED]
    if trained <= 0 or not math.isfinite(tokens):
        return None
    finished = at[0][lm.TRAJECTORIES_FINISHED] - at[1][lm.TRAJECTORIES_FINISHED]
    in_flight = IN_FLIGHT_DONE * (at[0][lm.TRAJECTORIES_IN_FLIGHT] - at[1][lm.TRAJECTORIES_IN_FLIGHT])
    per_trajectory = tokens / trained
    exact = all(lm.TRAJECTORIES_FINISHED_TOKENS in m for m in at)
    finished_tokens = (at[0][lm.TRAJECTORIES_FINISHED_TOKENS] - at[1][lm.TRAJECTORIES_FINISHED_TOKENS] if exact
                       else finished * per_trajectory)
    return {"finished_untrained": [at[0][lm.TRAJECTORIES_FINISHED], at[1][lm.TRAJECTORIES_FINISHED]],
            "in_flight": [at[0][lm.TRAJECTORIES_IN_FLIGHT], at[1][lm.TRAJECTORIES_IN_FLIGHT]],
            "trained_trajectories": trained, "drained_trajectories": finished + in_flight,
            "finished_tokens_logged": exact,
            "drained_tokens_est": finished_tokens + in_flight * per_trajectory}


def compare(baseline: dict, candidate: dict) -> Optional[float]:
    a, b = baseline.get("tokens_per_s"), candidate.get("tokens_per_s")
    return b / a if a and b else None


# the benchmark's arrival-time prefix, ``[   12.34] `` (bench.e2e.run_mode writes it before every console line)
ARRIVAL = re.compile(r"^\[\s*([0-9.]+)\] ")


def read_log(path: str, name: str) -> tuple[RunRecord, bool]:
    """A saved console log's step lines; the bool says whether the lines carry the benchmark's arrival times (a
    plain verl log gives only the metrics, every line at time 0)."""
    record, stamped, lines = RunRecord(name), 0, 0
    with open(path, errors="replace") as f:
        for line in f:
            lines += 1
            m = ARRIVAL.match(line)
            if m:
                stamped += 1
                record.feed(line[m.end():], float(m.group(1)))
            else:
                record.feed(line, 0.0)
    return record, lines > 0 and stamped * 2 > lines


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m verl_laminar.report.runlog LOG [--name N]``: the summary of one saved console log
    (for example a long run's reward curve: ``score_mean`` per step)."""
    import argparse
    import json

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("log")
    ap.add_argument("--name", default="run")
    args = ap.parse_args(argv)
    run, _ = read_log(args.log, args.name)
    print(json.dumps(summarise(run), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
