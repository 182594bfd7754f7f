"""End a process's descendants once it dies without ending them (``watch``; run as ``python -m`` by it).

Why. Ray ends an actor with SIGKILL: ``ray.kill``, a replica the hang watch or a fault kills, the end of a job. A
vLLM server actor's engine core and workers are its child processes and do not watch their parent, so they
outlive it, each keeping its memory (GPU memory on a GPU host). Worse, a worker's weight-receive socket keeps
reconnecting to its path, which verl names by the Ray job id; a fresh Ray cluster numbers jobs from ``01000000``
again, so the next run's sender on that host binds the same path, the orphan connects to it and swallows that
run's weight buckets, and the new replica never loads (seen as a 120 s load timeout).

How. ``watch(pid)`` starts a small guard process, a child of ``pid``. Every ``poll_s`` it records ``pid``'s
descendants with their start times; once ``pid`` is gone it SIGKILLs those of them that still run (the same start
time: never a process that reused a PID), then exits. A process ``pid`` starts and that dies within one poll is
missed; vLLM starts its engine once, at the server's start.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from typing import Optional

from verl_laminar.platform.procs import descendants, same_processes

logger = logging.getLogger(__name__)

POLL_S = 1.0


def guard(parent_pid: int, poll_s: float = POLL_S) -> list[int]:
    """Watch ``parent_pid`` until it is gone; then end what it left running. Returns the PIDs ended."""
    me = os.getpid()
    child = os.getppid() == parent_pid  # started by ``watch``: the parent's death re-parents this guard
    recorded: dict[int, float] = {}
    while True:
        # the re-parenting check also holds if the parent's PID is reused within a poll
        now = None if child and os.getppid() != parent_pid else descendants(parent_pid, skip=(me,))
        if now is None:
            break
        recorded = now
        time.sleep(poll_s)
    ended = []
    for pid in same_processes(recorded):
        try:
            os.kill(pid, signal.SIGKILL)
            ended.append(pid)
        except ProcessLookupError:
            pass
    if ended:
        logger.warning("laminar.orphan_guard: process %d died and left %d processes running (%s); ended them",
                       parent_pid, len(ended), ", ".join(map(str, ended)))
    return ended


def watch(pid: Optional[int] = None, poll_s: float = POLL_S) -> subprocess.Popen:
    """Start the guard of ``pid`` (default: this process) as its child; it ends on its own after ``pid``."""
    pid = os.getpid() if pid is None else int(pid)
    return subprocess.Popen([sys.executable, "-m", __name__, "--parent", str(pid), "--poll-s", str(poll_s)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, close_fds=True)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parent", type=int, required=True)
    ap.add_argument("--poll-s", type=float, default=POLL_S)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:%(asctime)s:%(message)s")
    # A SIGTERM or ^C to the parent's process group reaches this guard too; it must outlive the parent to end what
    # the parent leaves, and it exits within one poll after it anyway
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    guard(args.parent, args.poll_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
