"""A benchmark run's process tree: remember every descendant while it runs, end the ones left behind after it.

Ray re-parents its workers, and a run killed for memory can leave vLLM engines behind that would skew the next
run; ``TreeWatch`` records each descendant with its start time and, after the run, ends those still alive, by
PID. ``terminate`` ends a timed-out run's own process group. ``reporting`` runs a worker process that tells its
parent why it failed.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
import traceback
from typing import Any

from verl_laminar.platform.procs import descendants, same_processes

logger = logging.getLogger("verl_laminar.bench.e2e")


class TreeWatch:
    """Remembers every descendant of a run (Ray re-parents its workers, and a run killed for memory can leave
    vLLM engines behind, which would skew the next run); after the run, ends those still alive, by PID."""

    def __init__(self, pid: int, period_s: float = 5.0) -> None:
        self._pid, self._period_s = pid, period_s
        self._seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self._period_s):
            now = descendants(self._pid)
            if now is None:
                return
            for pid, created in now.items():
                self._seen.setdefault(pid, created)

    def stop_and_reap(self, mode: str) -> None:
        import psutil

        self._stop.set()
        self._thread.join()
        alive = []
        for pid in same_processes(self._seen):  # the same processes, not reused PIDs
            try:
                alive.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                continue
        if not alive:
            return
        logger.warning("%s: ending %d leftover processes of the run: %s", mode, len(alive),
                       sorted({_name(p) for p in alive}))
        for p in alive:
            _signal(p, "terminate")
        _, still = psutil.wait_procs(alive, timeout=20)
        for p in still:
            _signal(p, "kill")


def _name(p) -> str:
    """A process's name, or "(ended)": a leftover can exit between the scan and the report."""
    import psutil

    try:
        return p.name()
    except psutil.NoSuchProcess:
        return "(ended)"


def _signal(p, how: str) -> None:
    import psutil

    try:
        getattr(p, how)()
    except psutil.NoSuchProcess:
        pass


def terminate(proc: subprocess.Popen, mode: str) -> None:
    logger.error("%s: timed out; ending its process group %d", mode, proc.pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        time.sleep(20)


FAILED = "failed"  # the queue record of a worker that raised: (FAILED, name, traceback)


def reporting(target: Any, out: Any, name: str, *args: Any) -> None:
    """Run a worker; if it raises, put its traceback on the queue first. A dead engine worker's process can
    stay alive joining vLLM's engine core, so the parent would otherwise see only a barrier timeout."""
    try:
        target(name, *args)
    except BaseException:
        out.put((FAILED, name, traceback.format_exc()))
        out.close()
        out.join_thread()
        raise
