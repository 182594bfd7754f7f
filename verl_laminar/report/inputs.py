"""What a run directory holds, read into plain records (no plotting): console logs, timelines, the result JSON.

Two layouts:
    benchmark   ``python -m verl_laminar.bench.e2e --out RUN_DIR``: ``RUN_DIR/<mode>.log`` (the console, each line
                prefixed with its arrival time) and ``RUN_DIR/<mode>.steps.jsonl`` (its steps, stamped as they
                arrived: what the benchmark measured), ``RUN_DIR/<mode>/checkpoints/laminar_timeline.jsonl`` for
                Laminar modes, ``RUN_DIR/result.json``
    plain run   a verl run's console log(s) ``*.log``, maybe a Laminar step file and a ``laminar_timeline.jsonl``
                anywhere below
The steps come from the structured files; verl's console step lines are read only from a run directory saved before
the launcher kept them in a file.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from verl_laminar import stepfile
from verl_laminar import timeline as tl
from verl_laminar.report.runlog import VIOLATION, RunRecord, read_log
from verl_laminar.report.tracker_file import stamped_path

logger = logging.getLogger(__name__)

RESULT_NAME = "result.json"


class ReportError(ValueError):
    """The run directory lacks what a report needs; the message names what is missing and where."""


@dataclass
class ModeRun:
    """One run (a benchmark mode, or one plain log) and what it left."""

    name: str
    log: Path
    record: RunRecord
    stamped: bool  # arrival times are known (benchmark log), so step wall times are real
    timeline_path: Optional[Path] = None
    timeline: list = field(default_factory=list)  # timeline records, when the run wrote a timeline
    timeline_error: Optional[str] = None


@dataclass
class RunInputs:
    run_dir: Path
    modes: list[ModeRun]
    result: Optional[dict] = None
    result_path: Optional[Path] = None

    def mode_names(self) -> list[str]:
        return [m.name for m in self.modes]



def _find_logs(run_dir: Path) -> list[Path]:
    top = sorted(p for p in run_dir.glob("*.log") if p.is_file())
    return top or sorted(p for p in run_dir.rglob("*.log") if p.is_file())


def _mode_name(run_dir: Path, log: Path, taken: set[str]) -> str:
    name = log.stem
    if name in taken:  # two logs of one name in different folders: the folder tells them apart
        name = str(log.relative_to(run_dir).with_suffix(""))
    return name


def _owner(run_dir: Path, path: Path, modes: list[ModeRun]) -> Optional[ModeRun]:
    """The mode a timeline belongs to: the benchmark's ``<mode>/`` folder, else the only mode there is."""
    parts = path.relative_to(run_dir).parts
    by_name = {m.name: m for m in modes}
    if parts and parts[0] in by_name:
        return by_name[parts[0]]
    if len(modes) == 1:
        return modes[0]
    hits = [by_name[p] for p in parts if p in by_name]
    return hits[0] if hits else None


def _attach_timelines(run_dir: Path, modes: list[ModeRun]) -> None:
    for path in sorted(run_dir.rglob(tl.FILE_NAME)):
        owner = _owner(run_dir, path, modes)
        if owner is None:
            logger.warning("%s: no console log of its run (modes: %s); not drawn", path.relative_to(run_dir),
                           ", ".join(m.name for m in modes))
            continue
        if owner.timeline_path is not None:
            logger.warning("%s: run %s already has the timeline %s; not drawn", path.relative_to(run_dir),
                           owner.name, owner.timeline_path.relative_to(run_dir))
            continue
        owner.timeline_path = path
        try:
            owner.timeline = tl.read_timeline(path)
        except (OSError, ValueError) as e:
            owner.timeline_error = f"{path.relative_to(run_dir)} unreadable: {e}"
            logger.warning("%s", owner.timeline_error)


def _read_result(path: Path) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ReportError(f"result JSON {path}: cannot read it ({e})") from None
    if not isinstance(data, dict):
        raise ReportError(f"result JSON {path}: expected an object, got {type(data).__name__}")
    return data


def load_run(run_dir: Path, source_json: Optional[Path] = None) -> RunInputs:
    """Everything the report draws from; raises ReportError naming what is missing."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReportError(f"run directory {run_dir} does not exist (or is not a directory)")
    logs = _find_logs(run_dir)
    if not logs:
        raise ReportError(f"{run_dir}: no console log (*.log) in it or below it; pass the --out directory of "
                          "python -m verl_laminar.bench.e2e or a directory holding a verl run's console log")
    modes: list[ModeRun] = []
    for log in logs:
        name = _mode_name(run_dir, log, {m.name for m in modes})
        launched = stamped_path(log)  # the launcher's stamped steps (bench.launch): no console parsing
        if launched.is_file():
            starts = stepfile.run_starts(launched)
            record, stamped = RunRecord.from_step_file(name, launched, started=starts[0] if starts else None), True
            record.violations = sum(VIOLATION in line for line in log.read_text(errors="replace").splitlines())
        else:  # a run directory saved before the launcher kept its steps in a file: its console lines
            record, stamped = read_log(log, name)
        if not record.steps:
            # verl's console tracker off (trainer.logger without console): the Laminar run's step file beside it
            found = sorted(log.parent.rglob(stepfile.FILE_NAME))
            if len(found) == 1:
                record, stamped = RunRecord.from_step_file(name, found[0]), True  # wall times of its own
                logger.info("%s: no verl step lines; its steps from %s", log.relative_to(run_dir),
                            found[0].relative_to(run_dir))
        if not record.steps:
            logger.info("%s: no verl step lines; not a training run's log, skipped", log.relative_to(run_dir))
            continue
        modes.append(ModeRun(name, log, record, stamped))
    if not modes:
        names = ", ".join(str(p.relative_to(run_dir)) for p in logs)
        raise ReportError(f"{run_dir}: no verl step lines ('step:N - key:value - ...') in {names}; did the run "
                          "finish a training step?")
    _attach_timelines(run_dir, modes)
    result_path = Path(source_json) if source_json is not None else run_dir / RESULT_NAME
    if source_json is None and not result_path.is_file():
        return RunInputs(run_dir, modes)
    return RunInputs(run_dir, modes, _read_result(result_path), result_path)
