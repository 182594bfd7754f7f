"""A replica's processes as the trainer sees them: where they run, the kill (fault injection and the hang watch),
and the CPU priorities of rollouts and trainer ranks on a shared CPU host. Each acts on the node where the process
runs (``fleet.node_procs``): a PID read inside an actor names a process of that node's PID namespace only.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Iterable, Optional

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("LAMINAR_LOGGING_LEVEL", "INFO"))  # start-up decisions belong in the run's record


def node_of(actor: Any) -> str:
    import ray

    return ray.get(actor.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()))


def node_addresses(node_ids: Iterable[str]) -> list[str]:
    """``<address> (<node id's first 12>)`` of each Ray node id (``?`` for an address Ray no longer lists)."""
    import ray

    known = {n["NodeID"]: n.get("NodeManagerAddress", "?") for n in ray.nodes()}
    return [f"{known.get(n, '?')} ({n[:12]})" for n in node_ids]


def replica_roots(replica: Any) -> list:
    """The root processes of a replica (its server and workers), each where it runs (``fleet.node_procs.ProcRef``);
    the agents on their nodes are started now, so that a later kill is one call. Their children (vLLM's engine core,
    perhaps started later) are found on the node at kill time."""
    from verl_laminar.fleet import node_procs

    refs = [node_procs.locate(a) for a in (replica.server, *replica.workers)]
    try:
        node_procs.warm(r.node for r in refs)
    except Exception as e:  # noqa: BLE001 - a slow agent start must not fail the setup: the kill starts it then
        logger.warning("laminar: replica %d: the process agents on its nodes did not answer yet (%r); a kill will "
                       "wait for them", replica.replica_id, e)
    return refs


class ReplicaKillMissed(RuntimeError):
    """A signal meant to kill or stop a replica did not leave its processes so (or found none of them)."""


def struck(report: list[dict], hang: bool) -> list[dict]:
    """The processes of ``report`` (``fleet.node_procs.signal_procs``) that the signal did not leave as wanted
    (pure): running after a SIGKILL; not stopped after a SIGSTOP."""
    want = ("stopped", "gone") if hang else ("gone",)  # a stopped process that then died is no miss either
    return [p for p in report if p["state"] not in want]


def kill_replica(replica: Any, roots: Optional[list] = None, hang: bool = False,
                 why: str = "laminar.fault_injection") -> list[dict]:
    """SIGKILL a replica as a machine loss would, or with ``hang`` SIGSTOP it as a stuck one looks (fault
    injection, ``laminar.fault_injection``; the hang watch kills a hung one the same way), on the nodes where its
    processes run. ``roots``: from ``replica_roots``, found ahead (a hung server answers no call). Returns what was
    signalled (``[{"node", "pid", "name", "state"}]``); raises ReplicaKillMissed when nothing was found to signal
    or a process outlived the signal, so that no caller logs a kill that did not happen."""
    import signal

    from verl_laminar.fleet import node_procs

    roots = replica_roots(replica) if roots is None else roots
    sig = signal.SIGSTOP if hang else signal.SIGKILL
    report = node_procs.signal_procs(roots, sig)
    missed = struck(report, hang)
    if not report:  # the caller says whether that is a miss (a fault) or expected (the release of a dead one)
        raise ReplicaKillMissed(f"{sig.name} of replica {replica.replica_id}: none of its processes runs")
    if missed:
        logger.error("%s: %s of replica %d missed: signalled %s; not %s: %s", why, sig.name, replica.replica_id,
                     report, "stopped" if hang else "gone", missed)
        raise ReplicaKillMissed(f"{sig.name} of replica {replica.replica_id}: still running: {missed}")
    logger.warning("%s: %s replica %d (%s of %s)", why, "stopped" if hang else "killed", replica.replica_id,
                   sig.name, [(p["node"][:8], p["pid"], p["name"]) for p in report])
    return report


def kill_actor_process(actor: Any) -> tuple[Any, list[dict]]:
    """SIGKILL an actor's own process (not its children) on its node; (its ``ProcRef``, the report)."""
    import signal

    from verl_laminar.fleet import node_procs

    ref = node_procs.locate(actor)
    report = node_procs.signal_procs([ref], signal.SIGKILL, tree=False)
    if not report or struck(report, hang=False):
        raise ReplicaKillMissed(f"SIGKILL of the actor's process {ref.pid} on node {ref.node}: {report}")
    return ref, report


def cpu_priority_on(laminar: Any, cpu_platform: Optional[Callable[[], bool]] = None) -> bool:
    """Whether the trainer renices its processes (``apply_cpu_priority``): ``laminar.cpu_priority`` and the CPU
    platform (``cpu_platform``: the platform decision, ``platform.cpu.cpu_platform_requested`` unless given)."""
    if not laminar.cpu_priority:
        return False
    if cpu_platform is None:
        from verl_laminar.platform.cpu import cpu_platform_requested

        return bool(cpu_platform_requested())
    return bool(cpu_platform())


def shares_a_trainer_machine(node: str, trainer_nodes: Iterable[str]) -> bool:
    """Whether a rollout on ``node`` is lowered to nice 19: only beside a trainer rank. Elsewhere nothing of the
    trainer's competes with it, and nice 19 would only starve it behind verl's helpers on its own machine (agent
    loops, reward workers, stores run at nice 0): on 3 emulated machines a replica beside the agent loop took no
    request to its end for the whole run while the other replica did all the work."""
    return node in set(trainer_nodes)


def apply_cpu_priority(trainer_workers: list, replica_servers: list, trainer_nodes: Iterable[str] = ()) -> dict:
    """Rollouts at nice 19, trainer ranks at nice 0 (when permitted): on a shared CPU host, generation then
    fills the cycles training leaves idle instead of stretching the trainer's step (the critical path). A rollout
    is lowered only on a machine that holds a trainer rank (``shares_a_trainer_machine``); ``trainer_nodes``: those
    machines when ``trainer_workers`` is empty (a replacement joining). Returns the counts and ``trainer_nodes``."""
    from verl_laminar.fleet.node_procs import locate, renice_procs

    # on each process's own node: its PID means nothing on the trainer's
    trainers = [locate(w) for w in trainer_workers]
    nodes = sorted(set(trainer_nodes) | {t.node for t in trainers})
    out: dict = {"rollout": [], "trainer": [], "rollouts_left_alone": 0, "trainer_nodes": nodes}
    for s in replica_servers:
        ref = locate(s)
        if shares_a_trainer_machine(ref.node, nodes):
            out["rollout"].append(renice_procs([ref], 19))
        else:
            out["rollouts_left_alone"] += 1
    for ref in trainers:
        try:
            out["trainer"].append(renice_procs([ref], 0))
        except PermissionError:
            logger.warning("laminar.cpu_priority: no permission to raise the trainer's priority; only the rollouts "
                           "were lowered (nice 19)")
            break
    logger.info("laminar.cpu_priority: rollouts at nice 19 %s (%d on machines without a trainer rank left alone), "
                "trainer ranks at nice 0 %s", out["rollout"], out["rollouts_left_alone"], out["trainer"])
    return out
