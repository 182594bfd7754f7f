"""verl's file tracker, read as a run writes it: every step's metrics for the benchmarks, the chaos run and the e2e
tests, whatever the console shows (verl's console tracker may be off).

verl's ``FileLogger`` (``trainer.logger`` holding ``file``) writes one JSON line per training step to the path in
``VERL_FILE_LOGGER_PATH``: ``{"step": N, "data": {metric: value, ...}}``. The CPU recipes turn it on
(``recipes/cpu/common.sh``: ``trainer.logger=[console,file]``, the path passed to every Ray actor through the
job's runtime env). A benchmark follows the file while the run goes (``FileTail``) and stamps each step with the
time it appeared, the time between two steps being the wall time between two weight publications.

    FileLogger.log -> VERL_FILE_LOGGER_PATH -> FileTail.poll (new whole lines) -> parse_line -> RunRecord.add_step

Pure: the standard library only.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Mapping, Optional, Union

logger = logging.getLogger(__name__)

ENV = "VERL_FILE_LOGGER_PATH"  # read by verl's FileLogger in the trainer process
FILE_NAME = "verl_metrics.jsonl"  # where the CPU recipes put it: $OUT/verl_metrics.jsonl


def stamped_path(log_path: Union[str, Path]) -> Path:
    """Where a launcher (``bench.launch``) writes a run's steps, stamped with their arrival: beside its console log,
    as ``<log>.steps.jsonl`` in ``verl_laminar.stepfile``'s format (the launch time on its run line)."""
    return Path(log_path).with_suffix(".steps.jsonl")


def numbers(data: Mapping[str, Any]) -> dict[str, float]:
    """The numeric metrics of one step (numbers and bools; orjson writes numpy scalars as numbers), as floats."""
    out: dict[str, float] = {}
    for key, value in data.items():
        if isinstance(value, bool) or isinstance(value, (int, float)):
            out[str(key)] = float(value)
    return out


def parse_line(line: str) -> Optional[tuple[int, dict[str, float]]]:
    """``(step, metrics)`` of one line of verl's file tracker; None for a line that is not one (blank)."""
    line = line.strip()
    if not line:
        return None
    obj = json.loads(line)  # a bad whole line raises: the file is not verl's tracker output
    if not isinstance(obj, dict) or "step" not in obj or not isinstance(obj.get("data"), dict):
        raise ValueError(f"not a verl file-tracker line (want {{'step': N, 'data': {{...}}}}): {line[:120]!r}")
    return int(obj["step"]), numbers(obj["data"])


def read_steps(path: Union[str, Path]) -> dict[int, dict[str, float]]:
    """Every step of a finished run's tracker file (a torn last line, from a killed run, is skipped)."""
    steps: dict[int, dict[str, float]] = {}
    tail = FileTail(path)
    for step, metrics in tail.poll(final=True):
        steps.setdefault(step, {}).update(metrics)
    return steps


class FileTail:
    """Follows a tracker file as it grows: ``poll`` returns the steps of the whole lines written since the last
    call. A file that does not exist yet (the run has not logged a step) gives nothing; a file that shrank was
    opened again by a new run (FileLogger truncates), so it is read from its start."""

    def __init__(self, path: Union[str, Path]) -> None:
        self.path = Path(path)
        self._pos = 0
        self._partial = b""

    def poll(self, final: bool = False) -> list[tuple[int, dict[str, float]]]:
        """``final``: the run has ended, so a last line without its newline is complete or torn for good."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return []
        if size < self._pos:
            logger.warning("%s shrank (%d < %d bytes): a new run opened it; reading it from the start", self.path,
                           size, self._pos)
            self._pos, self._partial = 0, b""
        with open(self.path, "rb") as f:
            f.seek(self._pos)
            chunk = f.read()
        self._pos += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()  # b"" after a newline, else a line still being written
        out = [p for p in (self._parse(raw) for raw in lines) if p is not None]
        if final and self._partial:
            try:
                parsed = parse_line(self._partial.decode("utf-8", errors="replace"))
            except ValueError:
                logger.warning("%s: its last line is incomplete (the run stopped mid-write); skipped", self.path)
                parsed = None
            self._partial = b""
            if parsed is not None:
                out.append(parsed)
        return out

    def _parse(self, raw: bytes) -> Optional[tuple[int, dict[str, float]]]:
        return parse_line(raw.decode("utf-8", errors="replace"))

