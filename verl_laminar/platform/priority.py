"""CPU scheduling priority of whole process trees (every thread of every process).

Linux niceness is per thread: ``setpriority(PRIO_PROCESS, pid)`` changes only the thread whose id is ``pid``,
so a process whose worker threads already exist (torch intra-op, OpenMP, vLLM's engine) must be reniced
thread by thread. Threads created later inherit from their creator.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)


def _renice_threads(pid: int, niceness: int) -> int:
    done = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.setpriority(os.PRIO_PROCESS, int(tid), niceness)
            done += 1
        except ProcessLookupError:
            continue  # the thread ended meanwhile
    return done


def renice_tree(pid: int, niceness: int) -> dict[str, int]:
    """Set ``niceness`` on every thread of ``pid`` and its descendants; returns processes/threads changed.

    Raises PermissionError when lowering niceness without the privilege to (the caller decides what then).
    """
    import psutil

    if not -20 <= niceness <= 19:
        raise ValueError(f"niceness {niceness} outside -20..19")
    root = psutil.Process(pid)
    procs, threads = 0, 0
    for p in [root, *root.children(recursive=True)]:
        try:
            threads += _renice_threads(p.pid, niceness)
            procs += 1
        except (FileNotFoundError, ProcessLookupError, psutil.NoSuchProcess):
            continue
    return {"processes": procs, "threads": threads}

