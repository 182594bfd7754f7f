"""One recipe run for a benchmark or the chaos run: its console into a log, its steps from verl's file tracker.

    recipe command (VERL_FILE_LOGGER_PATH set) -> console lines, stamped, into LOG (for people; an exception name
    the run prints counts as an invariant violation) and, in a thread, report.tracker_file.FileTail on the tracker
    file -> each new step stamped with the seconds since launch -> RunRecord.add_step, and LOG's ``.steps.jsonl``
    (``verl_laminar.stepfile`` lines, Unix times: ``python -m verl_laminar.report`` reads it)

No metric is read from the console: a run with verl's console tracker off (``trainer.logger=[file]``) gives the same
record. The run's whole process tree is ended after it, or at its timeout.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from verl_laminar import stepfile
from verl_laminar.bench.tree import TreeWatch, terminate
from verl_laminar.report import tracker_file
from verl_laminar.report.runlog import RunRecord

logger = logging.getLogger("verl_laminar.bench.e2e")
REPO = Path(__file__).resolve().parents[2]
TAIL_PERIOD_S = 0.2  # how late a step may be stamped: small beside a step (tens of seconds here)
# Called with (name, event, detail) as a run progresses: "start", "step" (step number, seconds since launch), "end".
Progress = Callable[[str, str, dict], None]


class Stamper:
    """Follows the tracker file in a thread; each new step goes into the record with its arrival time."""

    def __init__(self, name: str, tracker: Path, record: RunRecord, out: Path, t0: float, t0_unix: float,
                 progress: Optional[Progress]) -> None:
        self._name, self._record, self._progress = name, record, progress
        self._t0, self._t0_unix = t0, t0_unix
        self._tail = tracker_file.FileTail(tracker)
        self._out = stepfile.StepFileWriter(out, append=False, t=t0_unix)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name=f"tail-{name}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(TAIL_PERIOD_S):
            self._take(final=False)

    def _take(self, final: bool) -> None:
        with self._lock:
            found = self._tail.poll(final=final)
            if not found:
                return
            t = time.monotonic() - self._t0
            for step, metrics in found:
                self._record.add_step(step, metrics, t)
                self._out.write(step, self._t0_unix + t, metrics)
                logger.debug("%s: step %d done at %.0f s", self._name, step, t)
                if self._progress:
                    self._progress(self._name, "step", {"step": step, "t": t})

    def finish(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._take(final=True)  # what the run wrote after the last poll
        self._out.close()


def run_logged(name: str, cmd: list[str], extra_env: dict[str, str], log_path: Path, timeout_s: float,
               progress: Optional[Progress] = None, tracker: Optional[Path] = None) -> RunRecord:
    """Run one training command: its console, stamped with arrival times, in ``log_path``; its steps from verl's
    file tracker at ``tracker`` (default beside the log, ``<log>.metrics.jsonl``; passed to the run as
    ``VERL_FILE_LOGGER_PATH``). A run that trained steps but left no tracker file is told apart in the log."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    tracker = Path(tracker) if tracker is not None else log_path.with_suffix(".metrics.jsonl")
    if tracker.exists():
        tracker.unlink()  # a previous run's file would be read as this run's steps
    env = {**os.environ, **extra_env, tracker_file.ENV: str(tracker)}
    record = RunRecord(name)
    logger.info("%s: %s (log %s)", name, " ".join(cmd), log_path)
    if progress:
        progress(name, "start", {"log": str(log_path)})
    t0, t0_unix = time.monotonic(), time.time()
    # a session of its own, so a timeout ends this run's whole process tree (and only it)
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", start_new_session=True)
    timer = threading.Timer(timeout_s, terminate, args=(proc, name))
    timer.start()
    tree = TreeWatch(proc.pid)
    stamper = Stamper(name, tracker, record, tracker_file.stamped_path(log_path), t0, t0_unix, progress)
    try:
        with open(log_path, "w") as log:
            for line in proc.stdout:
                log.write(f"[{time.monotonic() - t0:9.2f}] {line}")
                record.note_line(line)
        record.exit_code = proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:  # left early (SIGTERM, Ctrl-C): the run's own session goes first, then its leftovers
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        tree.stop_and_reap(name)
        stamper.finish()
    elapsed = time.monotonic() - t0
    if not tracker.exists():
        logger.warning("%s: no step metrics at %s: the run logged no step to verl's file tracker (trainer.logger "
                       "must hold 'file'; the CPU recipes set it)", name, tracker)
    logger.debug("%s: exit %s after %.0f s", name, record.exit_code, elapsed)
    if progress:
        progress(name, "end", {"exit_code": record.exit_code, "t": elapsed, "log": str(log_path)})
    return record
