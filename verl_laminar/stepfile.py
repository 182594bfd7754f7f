"""Every training step's metrics in a file, whatever trackers the user picked (``trainer.logger``).

The Laminar trainer writes, beside its timeline (``timeline.run_path``), ``laminar_metrics.jsonl``: one line per
trained step with every numeric metric verl logs for it (its own, the ``laminar/*`` ones, timings), and the wall time
the step's metrics were final. A resumed run appends, after a ``run`` line, so the file holds every (re)start.

    LaminarTrainer._compute_metrics -> StepFileWriter.write(step, t, metrics) (flushed per line: a killed run
    keeps every step it finished) -> read_step_file -> report.runlog.RunRecord.from_step_file (tests, chaos,
    benchmarks; no console parsing)

Line kinds:
    {"kind": "run", "t": ...}                                   once per (re)start
    {"kind": "step", "step": N, "t": ..., "metrics": {...}}     one per step, values floats

Pure: standard library only, so the report reads it anywhere.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Union

logger = logging.getLogger(__name__)

FILE_NAME = "laminar_metrics.jsonl"


def path_beside(timeline_path: Union[str, Path]) -> Path:
    """The step file of a run whose timeline is ``timeline_path`` (the same directory)."""
    return Path(timeline_path).parent / FILE_NAME


def numeric(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The metrics that are numbers (bools, numpy scalars and 0-d arrays included), as floats; text is skipped."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, (str, bytes)):
            continue  # float("3") would parse it: a string metric is not a number
        try:
            out[str(key)] = float(value)  # int, bool, float, numpy scalar, 0-d array, 1-element tensor
        except (TypeError, ValueError):
            continue
    return out


def _encode(value: float) -> Union[float, str]:
    # JSON has no NaN or infinity: written as 'nan', 'inf', '-inf', which the reader's float() turns back
    return value if math.isfinite(value) else repr(value)  # 'nan', 'inf', '-inf'


@dataclass(frozen=True)
class StepLine:
    step: int
    t: float  # Unix seconds
    metrics: dict[str, float]
    run: int  # 0 for the first (re)start in the file, 1 for the next...


class StepFileWriter:
    def __init__(self, path: Union[str, Path], append: bool, t: float) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f: Optional[Any] = open(self.path, "a" if append else "w", encoding="utf-8")
        self._line({"kind": "run", "t": t})

    def _line(self, obj: dict) -> None:
        if self._f is None:
            raise ValueError(f"step file {self.path} is closed")
        self._f.write(json.dumps(obj, sort_keys=True) + "\n")
        self._f.flush()

    def write(self, step: int, t: float, metrics: Mapping[str, Any]) -> None:
        values = {k: _encode(v) for k, v in numeric(metrics).items()}
        self._line({"kind": "step", "step": int(step), "t": float(t), "metrics": values})

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def read_step_file(path: Union[str, Path]) -> list[StepLine]:
    """Every step line, in order, numbered by the (re)start it belongs to. A torn last line (the run was killed
    mid-write) is ignored; a bad line elsewhere raises ValueError naming it."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    torn = bool(lines) and lines[-1] != ""
    out: list[StepLine] = []
    run = -1
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if obj["kind"] == "run":
                run += 1
            elif obj["kind"] == "step":
                metrics = {k: float(v) for k, v in obj["metrics"].items()}
                out.append(StepLine(int(obj["step"]), float(obj["t"]), metrics, max(run, 0)))
            else:
                raise ValueError(f"unknown kind {obj['kind']!r}")
        except (ValueError, TypeError, KeyError) as e:
            if torn and i == len(lines):
                logger.warning("%s: last line %d is incomplete (the run stopped mid-write); ignored", path, i)
                break
            raise ValueError(f"{path}:{i}: not a step-file line ({e!r})") from None
    return out


def run_starts(path: Union[str, Path]) -> list[float]:
    """The ``t`` of each (re)start line, in order (a benchmark's launcher writes its launch time there)."""
    out = []
    for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue  # a torn line; read_step_file reports it
        if isinstance(obj, dict) and obj.get("kind") == "run":
            out.append(float(obj["t"]))
    return out
