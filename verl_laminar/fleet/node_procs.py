"""Act on an actor's processes where they run: on its own node, inside that node's PID namespace.

``os.getpid()`` inside an actor is a PID of its node. On a multi-node cluster (and on the emulated one, where each
node has a PID namespace of its own) that number names nothing, or another process, on the caller's node: a kill or
renice by that PID from the caller's node misses, or hits the wrong process, while logging success. So a target is
a ``ProcRef`` (node id, PID namespace, PID, start time), and the signal or renice runs on the target's node: in this
process when the target shares its node and PID namespace, otherwise in a small ``NodeAgent`` actor pinned there
(hard node affinity on the node id Ray reports for the target), which resolves the process tree there
(``platform.proctree``) and reports what became of each process.

Agents are started ahead (``warm``) by whoever knows its targets early (the fault injector when it arms, the hang
watch when it tracks a replica), so a strike is one actor call, not an actor start. They are owned by the process
that starts them and end with it.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Iterable, Optional

logger = logging.getLogger(__name__)

CALL_TIMEOUT_S = 60.0  # an agent's start on a loaded CPU node takes seconds; a signal itself milliseconds


@dataclass(frozen=True)
class ProcRef:
    """One process of an actor: where it runs (node, PID namespace) and who it is there (PID, start time)."""

    node: str
    pidns: str
    pid: int
    started: Optional[float]

    @property
    def root(self) -> tuple[int, Optional[float]]:
        return self.pid, self.started


def by_place(refs: Iterable[ProcRef]) -> dict[tuple[str, str], list[tuple[int, Optional[float]]]]:
    """Roots grouped by (node, PID namespace), in first-seen order (pure): one call per place."""
    out: dict[tuple[str, str], list[tuple[int, Optional[float]]]] = {}
    for r in refs:
        roots = out.setdefault((r.node, r.pidns), [])
        if r.root not in roots:
            roots.append(r.root)
    return out


def is_here(place: tuple[str, str], here: tuple[str, str]) -> bool:
    """Whether this process can act on ``place``'s PIDs itself: the same node and the same PID namespace (pure)."""
    return place == here


class NodeAgent:
    """Runs on one node (hard affinity): signals and renices process trees by the PIDs of that node."""

    def __init__(self) -> None:
        from verl_laminar.platform.proctree import pid_namespace

        self._pidns = pid_namespace()

    def place(self) -> tuple[str, str]:
        import ray

        return ray.get_runtime_context().get_node_id(), self._pidns

    def _check(self, pidns: str) -> None:
        # the PIDs were read in ``pidns``: in another namespace they may name other processes
        if pidns != self._pidns:
            raise RuntimeError(f"PIDs of PID namespace {pidns} cannot be acted on from {self._pidns}")

    def signal(self, pidns: str, roots: list, signum: int, tree: bool, settle_s: float) -> list[dict]:
        from verl_laminar.platform.proctree import signal_tree

        self._check(pidns)
        return signal_tree([tuple(r) for r in roots], signum, tree=tree, settle_s=settle_s)

    def renice(self, pidns: str, roots: list, niceness: int) -> dict:
        from verl_laminar.platform.proctree import renice_roots

        self._check(pidns)
        try:
            return renice_roots([tuple(r) for r in roots], niceness)
        except PermissionError as e:  # returned, not raised: the caller re-raises it as what it is
            return {"permission_error": str(e)}


_agents: dict[str, Any] = {}
_lock = threading.Lock()


def here() -> tuple[str, str]:
    """(node id, PID namespace) of this process."""
    import ray

    from verl_laminar.platform.proctree import pid_namespace

    return ray.get_runtime_context().get_node_id(), pid_namespace()


def _identity_with_node() -> dict:
    import ray

    from verl_laminar.platform.proctree import identity

    return {**identity(), "node": ray.get_runtime_context().get_node_id()}


def locate(actor: Any, timeout_s: float = CALL_TIMEOUT_S) -> ProcRef:
    """The actor's process, as the actor sees itself (its node's PID, not one of the caller's)."""
    import ray

    got = ray.get(actor.__ray_call__.remote(lambda self: _identity_with_node()), timeout=timeout_s)
    return ProcRef(got["node"], got["pidns"], int(got["pid"]), got["started"])


def agent_on(node: str) -> Any:
    """This process's agent on ``node`` (started once, then reused)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    with _lock:
        if node not in _agents:
            # num_cpus=0: it must start on a node whose CPUs the replica holds; max_concurrency: a renice
            # is not queued behind a kill's settle wait
            _agents[node] = ray.remote(NodeAgent).options(
                num_cpus=0, max_restarts=0, max_concurrency=4,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False)).remote()
        return _agents[node]


def warm(nodes: Iterable[str], timeout_s: float = CALL_TIMEOUT_S) -> None:
    """Start the agents on ``nodes`` other than this process's place, and wait until they answer."""
    import ray

    mine = here()
    handles = [agent_on(n) for n in dict.fromkeys(nodes) if n != mine[0]]
    ray.get([h.place.remote() for h in handles], timeout=timeout_s)


def forget(node: str) -> None:
    """Drop a dead agent (its node died) so that the next call starts a new one."""
    with _lock:
        _agents.pop(node, None)


def _on_places(refs: Iterable[ProcRef], method: str, *args: Any, timeout_s: float = CALL_TIMEOUT_S) -> dict:
    """``method`` of ``NodeAgent`` for each place's roots: in this process where it can, else on the node;
    the remote ones in parallel. {place: result}."""
    import ray

    mine = here()
    places = by_place(refs)
    refs_out = {p: getattr(agent_on(p[0]), method).remote(p[1], roots, *args)
                for p, roots in places.items() if not is_here(p, mine)}
    local = NodeAgent() if any(is_here(p, mine) for p in places) else None
    out = {p: getattr(local, method)(p[1], roots, *args) for p, roots in places.items() if is_here(p, mine)}
    for p, ref in refs_out.items():
        try:
            out[p] = ray.get(ref, timeout=timeout_s)
        except ray.exceptions.RayActorError:
            forget(p[0])  # its node is gone: so are the processes; a later call starts a fresh agent
            raise
    return out


def signal_procs(refs: Iterable[ProcRef], signum: int, tree: bool = True, settle_s: float = 5.0,
                 timeout_s: float = CALL_TIMEOUT_S) -> list[dict]:
    """Signal the processes of ``refs`` (and their trees) on their nodes. Returns ``[{"node", "pid", "name",
    "state"}]`` for every process signalled (``platform.proctree.signal_tree``)."""
    results = _on_places(refs, "signal", int(signum), tree, settle_s, timeout_s=timeout_s + settle_s)
    return [{"node": place[0], **r} for place, got in results.items() for r in got]


def renice_procs(refs: Iterable[ProcRef], niceness: int, timeout_s: float = CALL_TIMEOUT_S) -> dict[str, int]:
    """Renice the trees of ``refs`` on their nodes; the counts summed. Raises PermissionError as ``renice_tree``."""
    total = {"processes": 0, "threads": 0}
    for place, got in _on_places(refs, "renice", int(niceness), timeout_s=timeout_s).items():
        if "permission_error" in got:
            raise PermissionError(f"renice on node {place[0]}: {got['permission_error']}")
        total = {k: total[k] + got[k] for k in total}
    return total
