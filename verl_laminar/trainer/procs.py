"""A replica's processes as the trainer sees them: their PIDs and process trees, the kill (fault injection and
the hang watch), and the CPU priorities of rollouts and trainer ranks on a shared CPU host.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Optional

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("LAMINAR_LOGGING_LEVEL", "INFO"))  # start-up decisions belong in the run's record


def node_of(actor: Any) -> str:
    import ray

    return ray.get(actor.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()))


def pid_of(actor: Any) -> int:
    import ray

    from verl_laminar.platform.priority import current_pid

    return int(ray.get(actor.__ray_call__.remote(lambda self: current_pid())))


def process_tree(roots: list[int]) -> list[int]:
    """``roots`` and every process they started, as they are now (on this node)."""
    import psutil

    pids: list[int] = []
    for pid in roots:
        try:
            pids += [pid] + [c.pid for c in psutil.Process(pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    return list(dict.fromkeys(pids))


def local_roots(replica: Any) -> list[int]:
    """PIDs of the replica's server and workers that run on this node (a PID means nothing on another node)."""
    import ray

    here = ray.get_runtime_context().get_node_id()
    return [pid_of(a) for a in (replica.server, *replica.workers) if node_of(a) == here]


def replica_pids(replica: Any) -> list[int]:
    """A replica's processes: its server actor, its workers and every process they started (vLLM's engine core)."""
    return process_tree([pid_of(replica.server)] + [pid_of(w) for w in replica.workers])


def kill_replica(replica: Any, pids: Optional[list[int]] = None, hang: bool = False,
                 why: str = "laminar.fault_injection") -> list[int]:
    """SIGKILL a replica as a machine loss would, or with ``hang`` SIGSTOP it as a stuck one looks (fault
    injection, ``laminar.fault_injection``; the hang watch kills a hung one the same way). ``pids``: from
    ``replica_pids``, collected ahead so the signal itself takes microseconds; returns the PIDs signalled."""
    import signal

    pids = replica_pids(replica) if pids is None else pids
    sig = signal.SIGSTOP if hang else signal.SIGKILL
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            continue
    logger.warning("%s: %s replica %d (%s of PIDs %s)", why, "stopped" if hang else "killed", replica.replica_id,
                   sig.name, pids)
    return pids


def cpu_priority_on(laminar: Any, cpu_platform: Optional[Callable[[], bool]] = None) -> bool:
    """Whether the trainer renices its processes (``apply_cpu_priority``): ``laminar.cpu_priority`` and the CPU
    platform (``cpu_platform``: the platform decision, ``platform.cpu.cpu_platform_requested`` unless given)."""
    if not laminar.cpu_priority:
        return False
    if cpu_platform is None:
        from verl_laminar.platform.cpu import cpu_platform_requested

        return bool(cpu_platform_requested())
    return bool(cpu_platform())


def apply_cpu_priority(trainer_workers: list, replica_servers: list) -> dict:
    """Rollouts at nice 19, trainer ranks at nice 0 (when permitted): on a shared CPU host, generation then
    fills the cycles training leaves idle instead of stretching the trainer's step (the critical path)."""
    from verl_laminar.platform.priority import renice_tree

    out = {"rollout": [renice_tree(pid_of(s), 19) for s in replica_servers], "trainer": []}
    for w in trainer_workers:
        try:
            out["trainer"].append(renice_tree(pid_of(w), 0))
        except PermissionError:
            logger.warning("laminar.cpu_priority: no permission to raise the trainer's priority; only the rollouts "
                           "were lowered (nice 19)")
            break
    logger.info("laminar.cpu_priority: rollouts at nice 19 %s, trainer ranks at nice 0 %s", out["rollout"],
                out["trainer"])
    return out
