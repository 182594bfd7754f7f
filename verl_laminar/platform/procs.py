"""Ending the processes a component started, by PID: vLLM's engine and worker processes outlive their Ray actor
when the actor is killed, so whoever started a replica reaps its process tree.

A process is identified by its PID **and** start time (``started_at``, ``descendants``, ``same_processes``), so a
PID reused by another process is never signalled. Used by the orphan guard, the hang watch's killer, the benchmarks'
process-tree watch and the repack benchmark; not a benchmark helper, so the runtime does not import a benchmark.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping, Optional


def started_at(pid: int) -> Optional[float]:
    """The process's start time (with its PID, what identifies it), or None once it is gone."""
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None


def descendants(pid: int, skip: Iterable[int] = ()) -> Optional[dict[int, float]]:
    """``pid``'s descendants (PID -> start time) but ``skip``, or None once ``pid`` is gone or a zombie."""
    import psutil

    skipped = set(skip)
    try:
        parent = psutil.Process(pid)
        if parent.status() == psutil.STATUS_ZOMBIE:
            return None
        out = {}
        for p in parent.children(recursive=True):
            if p.pid not in skipped:
                try:
                    out[p.pid] = p.create_time()
                except psutil.NoSuchProcess:
                    pass
        return out
    except psutil.NoSuchProcess:
        return None


def same_processes(recorded: Mapping[int, float],
                   started: Callable[[int], Optional[float]] = started_at) -> list[int]:
    """The recorded processes that still run as themselves (the same start time: never one that reused a PID)."""
    return sorted(pid for pid, t in recorded.items() if started(pid) == t)


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
