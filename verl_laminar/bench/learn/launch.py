"""One recipe run under a wall-clock budget: ``bench.launch``'s logging and step stamping, plus an end set by the
benchmark's clock, and checkpoints pruned to the ones the marks need while the run goes.

    recipe (its own session) -> console into LOG, steps from verl's file tracker stamped on arrival (as
    bench.launch) -> on each step: the clock (clock.py) gives the run's deadline (t0 + budget + saves so far)
    and the versions still needed (plan.keep_while_running; the other global_step_<n> folders are deleted) ->
    a watchdog ends the run's process group at its deadline (SIGTERM, then SIGKILL), or when no step arrived
    within the start-up limit -> leftovers of the process tree are ended by PID (bench.tree.TreeWatch), and
    the relay stores no live relay holds are removed from /dev/shm (platform.shm_cleanup.sweep_relay_stores).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from verl_laminar.bench.launch import Stamper
from verl_laminar.bench.learn import clock, plan
from verl_laminar.bench.tree import TreeWatch
from verl_laminar.platform.shm_cleanup import sweep_relay_stores
from verl_laminar.report import tracker_file
from verl_laminar.report.runlog import RunRecord

logger = logging.getLogger("verl_laminar.bench.learn")
REPO = plan.REPO
WATCH_PERIOD_S = 0.5
TERM_GRACE_S = 30.0
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


@dataclass
class Outcome:
    record: RunRecord
    ended_by: str  # "budget", "start-up limit", "exit <code>"
    launch_unix: float  # Unix time of the launch (seen_s counts from it)
    wall_s: float


def published(record: RunRecord, budget_s: float) -> list[tuple[float, int]]:
    """(clock s, version) of every step that arrived within the budget."""
    return [(s.clock_s, s.step) for s in clock.within(clock.clock_times(record.steps, record.seen_s), budget_s)]


def prune(checkpoints: Path, keep: set[int], newest: int) -> list[int]:
    """Delete ``global_step_<n>`` folders with n <= newest that are not in ``keep``; the versions deleted."""
    gone = []
    if not checkpoints.is_dir():
        return gone
    for entry in checkpoints.iterdir():
        m = _STEP_DIR.match(entry.name)
        if m and int(m.group(1)) <= newest and int(m.group(1)) not in keep:
            shutil.rmtree(entry, ignore_errors=True)
            gone.append(int(m.group(1)))
    return sorted(gone)


class _Watch:
    """The run's deadline, moved by every step; ends the process group when it passes."""

    def __init__(self, name: str, proc: subprocess.Popen, t0: float, budget_s: float, startup_s: float,
                 marks: Sequence[float], checkpoints: Optional[Path]) -> None:
        self.name, self.proc, self.t0, self.budget_s, self.startup_s = name, proc, t0, budget_s, startup_s
        self.marks, self.checkpoints = list(marks), checkpoints
        self.deadline: Optional[float] = None
        self.ended_by: Optional[str] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"budget-{name}", daemon=True)

    def on_step(self, record: RunRecord) -> None:
        """Called by the stamper's thread after each new step (the record holds it)."""
        self.deadline = clock.deadline_s(record.steps, record.seen_s, self.budget_s)
        pub = published(record, self.budget_s)
        if self.checkpoints is not None and pub:
            gone = prune(self.checkpoints, plan.keep_while_running(self.marks, pub), pub[-1][1])
            if gone:
                logger.debug("%s: pruned checkpoints %s", self.name, gone)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=TERM_GRACE_S + 10)

    def _loop(self) -> None:
        while not self._stop.wait(WATCH_PERIOD_S):
            if self.proc.poll() is not None:
                return
            elapsed = time.monotonic() - self.t0
            if self.deadline is not None and elapsed >= self.deadline:
                self.ended_by = "budget"
            elif self.deadline is None and elapsed >= self.startup_s:
                self.ended_by = "start-up limit"
            else:
                continue
            logger.info("%s: ending the run (%s) %.0f s after its launch", self.name, self.ended_by, elapsed)
            end_group(self.proc)
            return


def end_group(proc: subprocess.Popen) -> None:
    """SIGTERM the run's process group, SIGKILL what is left after a grace period."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=TERM_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            continue


def launch(name: str, cmd: list[str], env: dict[str, str], log_path: Path, tracker: Path, budget_s: float,
           startup_s: float, marks: Sequence[float], checkpoints: Optional[Path] = None) -> Outcome:
    """Run one recipe until its clock reaches ``budget_s`` (or it exits, or no step arrives in ``startup_s``)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if tracker.exists():
        tracker.unlink()  # a previous run's file would be read as this run's steps
    full_env = {**os.environ, **env, tracker_file.ENV: str(tracker)}
    record = RunRecord(name)
    logger.info("%s: %s (log %s)", name, " ".join(cmd), log_path)
    t0, t0_unix = time.monotonic(), time.time()
    proc = subprocess.Popen(cmd, cwd=REPO, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", start_new_session=True)
    watch = _Watch(name, proc, t0, budget_s, startup_s, marks, checkpoints)

    def progress(run: str, event: str, d: dict) -> None:
        if event == "step":
            watch.on_step(record)
            logger.info("%s: step %d arrived %.0f s after launch", run, d["step"], d["t"])

    tree = TreeWatch(proc.pid)
    stamper = Stamper(name, tracker, record, tracker_file.stamped_path(log_path), t0, t0_unix, progress)
    watch.start()
    try:
        with open(log_path, "w") as log:
            for line in proc.stdout:
                log.write(f"[{time.monotonic() - t0:9.2f}] {line}")
                record.note_line(line)
        record.exit_code = proc.wait()
    finally:
        watch.stop()
        if proc.poll() is None:  # the benchmark itself was stopped: the run goes too
            end_group(proc)
        tree.stop_and_reap(name)
        stamper.finish()
        try:  # a run ended by its budget leaves its relays' versions in /dev/shm; live relays' are never touched
            swept = sweep_relay_stores()
        except OSError as e:
            swept = []
            logger.warning("%s: could not sweep the relay stores: %s", name, e)
        if swept:
            logger.info("%s: removed the relay stores its ended relays left: %s", name, swept)
    wall = time.monotonic() - t0
    ended = watch.ended_by or f"exit {record.exit_code}"
    logger.info("%s: ended (%s) after %.0f s, %d steps", name, ended, wall, len(record.steps))
    return Outcome(record, ended, t0_unix, wall)
