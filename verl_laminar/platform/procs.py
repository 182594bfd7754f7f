"""Ending the processes a component started, by PID: vLLM's engine and worker processes outlive their Ray actor
when the actor is killed, so whoever started a replica reaps its process tree.

Used by the failover runtime, the repack benchmark and its tests; not a benchmark helper, so the runtime does not
import a benchmark for it.
"""

from __future__ import annotations


def reap(pids: list[int], grace_s: float = 5.0) -> list[int]:
    """End what the replicas started (vLLM engine and worker processes) if it outlived them; by PID.

    SIGTERM first, SIGKILL after ``grace_s``; returns every PID it tried (the given ones and their children)."""
    import psutil

    procs = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            procs.append(p)
            procs.extend(p.children(recursive=True))
        except psutil.NoSuchProcess:
            pass
    for p in procs:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    return [p.pid for p in procs]


def exit_on_sigterm() -> None:
    """Turn SIGTERM into ``SystemExit(143)`` in the main thread, so a benchmark's ``finally`` blocks run and end
    the processes it started. Python's default for SIGTERM is to die at once, which orphaned a killed profile's
    vLLM engines (12 GiB of them, which then ran the next profile out of memory)."""
    import signal

    def _exit(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)
