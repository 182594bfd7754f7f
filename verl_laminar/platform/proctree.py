"""Signal or renice process trees on this machine, by PID and start time, and report what became of each process.

A PID names a process only inside its PID namespace: on a cluster (and on the emulated one) that is the node's, so
these functions must run on the node whose processes they act on (``fleet.node_procs`` sends them there). They know
nothing of Ray. A root is ``(pid, start time)``: a PID reused by another process since the root was found is never
signalled (psutil checks the start time again right before each signal).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Iterable, Optional

# what a signal must have done to a process for the caller to count it as struck
EXPECTED_STATE = {signal.SIGKILL: "gone", signal.SIGSTOP: "stopped"}


def pid_namespace() -> str:
    """``pid:[inode]`` of this process's PID namespace (two processes with equal values see the same PIDs)."""
    return os.readlink("/proc/self/ns/pid")


def identity() -> dict:
    """This process as a root: its PID, start time and PID namespace."""
    import psutil

    return {"pid": os.getpid(), "started": psutil.Process().create_time(), "pidns": pid_namespace()}


def resolve(roots: Iterable[tuple[int, Optional[float]]], tree: bool = True) -> list:
    """The roots that still run as themselves and (with ``tree``) every process they started, as psutil
    processes. Never this process: the one that signals must outlive its signal to report."""
    import psutil

    found: dict[int, psutil.Process] = {}
    for pid, started in roots:
        try:
            p = psutil.Process(pid)
            if started is not None and p.create_time() != started:
                continue  # the PID now names another process
            found.setdefault(p.pid, p)
            if tree:
                for child in p.children(recursive=True):
                    found.setdefault(child.pid, child)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    found.pop(os.getpid(), None)
    return list(found.values())


def state(p) -> str:
    """``gone`` (ended, or a zombie waiting for its reaper: it runs no more), ``stopped`` or ``running``."""
    import psutil

    try:
        if not p.is_running():  # also false when the PID was reused
            return "gone"
        status = p.status()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return "gone"
    if status in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
        return "gone"
    if status in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
        return "stopped"
    return "running"


def _name(p) -> str:
    import psutil

    try:
        return p.name()
    except psutil.Error:
        return "?"


def signal_tree(roots: Iterable[tuple[int, Optional[float]]], signum: int, tree: bool = True,
                settle_s: float = 5.0, poll_s: float = 0.02) -> list[dict]:
    """Send ``signum`` to the roots' processes (their trees with ``tree``), then wait up to ``settle_s`` until each
    is in the state the signal should leave it in (``EXPECTED_STATE``; other signals are not waited for).

    Returns ``[{"pid", "name", "state"}]`` for every process signalled: the caller checks the effect instead of
    trusting the signal (a process can survive a signal it was never sent, e.g. through a wrong PID namespace).
    """
    import psutil

    procs = resolve(roots, tree)
    names = {p.pid: _name(p) for p in procs}
    for p in procs:
        try:
            p.send_signal(signum)  # psutil re-checks the start time: a reused PID is not signalled
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    want = EXPECTED_STATE.get(signal.Signals(signum))
    deadline = time.monotonic() + settle_s
    states = {p.pid: state(p) for p in procs}
    while want and any(s != want for s in states.values()) and time.monotonic() < deadline:
        time.sleep(poll_s)
        states = {p.pid: state(p) for p in procs}
    return [{"pid": p.pid, "name": names[p.pid], "state": states[p.pid]} for p in procs]


def renice_roots(roots: Iterable[tuple[int, Optional[float]]], niceness: int) -> dict[str, int]:
    """``priority.renice_tree`` of each root that still runs as itself; the counts summed. PermissionError (raising
    priority without the privilege) propagates: the caller decides what then."""
    import psutil

    from verl_laminar.platform.priority import renice_tree

    total = {"processes": 0, "threads": 0}
    for p in resolve(roots, tree=False):
        try:
            done = renice_tree(p.pid, niceness)
        except (FileNotFoundError, ProcessLookupError, psutil.NoSuchProcess):
            continue  # ended meanwhile
        total = {k: total[k] + done[k] for k in total}
    return total
