"""The relay group of a Laminar run and what the router needs of each replica: where relays go (one per rollout
node), the spawn, and each replica's relay.
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any, Optional

from verl_laminar.trainer.procs import node_of

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("LAMINAR_LOGGING_LEVEL", "INFO"))  # start-up decisions belong in the run's record

def replica_handles(replicas: list) -> list:
    """What the router needs of each verl RolloutReplica."""
    from verl_laminar.rollout.router import ReplicaHandles

    return [ReplicaHandles(replica_id=int(r.replica_rank), address=r.server_address, server=r.server_handle,
                           workers=tuple(r.workers)) for r in replicas]


def relay_nodes(nodes: list[dict], rollout_node_ids: Optional[Any], master_node_id: str) -> list[tuple[str, str]]:
    """(node id, node ip) of the nodes that get a relay, sorted by node id (pure).

    ``nodes``: ``ray.nodes()``-like dicts (``NodeID``, ``NodeManagerAddress``, ``Alive``). A relay runs on every
    alive node of ``rollout_node_ids`` and on ``master_node_id`` (trainer rank 0's node, the master); other
    trainer nodes never read a version and get none. ``rollout_node_ids=None``: every alive node.
    """
    alive = {n["NodeID"]: n["NodeManagerAddress"] for n in nodes if n.get("Alive")}
    if master_node_id not in alive:
        raise ValueError(f"trainer rank 0's node {master_node_id} is not an alive Ray node; the master relay must "
                         "run there (check `ray status`)")
    wanted = set(alive) if rollout_node_ids is None else {n for n in rollout_node_ids if n in alive}
    return [(nid, alive[nid]) for nid in sorted(wanted | {master_node_id})]


# without a heartbeat section: how long a relay may leave a ping unanswered before the monitor drops it from the
# chain, and how often it looks. Generous: a false drop moves a live relay's rollouts to a fallback for the run
DEFAULT_PING_TIMEOUT_S = 10.0
DEFAULT_MONITOR_INTERVAL_S = 1.0


def monitor_settings(heartbeat: Optional[Any]) -> dict:
    """The relay group's monitor, from ``laminar.heartbeat`` (pure): ping every ``interval_s``, and a relay silent
    for ``dead_after_s`` is dead, as a replica is to the hang watch."""
    if heartbeat is None:
        return {"ping_timeout_s": DEFAULT_PING_TIMEOUT_S, "monitor_interval_s": DEFAULT_MONITOR_INTERVAL_S}
    dead = heartbeat.dead_after_s if heartbeat.dead_after_s is not None else DEFAULT_PING_TIMEOUT_S
    return {"ping_timeout_s": float(dead), "monitor_interval_s": float(heartbeat.interval_s)}


def spawn_relays(trainer_rank0: Any, group_name: Optional[str] = None, replicas: Optional[list] = None,
                 relay: Optional[Any] = None, heartbeat: Optional[Any] = None,
                 version_bytes: Optional[int] = None) -> Any:
    """The relay group: one relay per rollout node plus one on trainer rank 0's node, the master.

    ``replicas``: verl's rollout replicas (each with ``.workers``); None puts a relay on every alive node.
    ``relay``: the typed ``laminar.relay`` section (``keep_versions``, ``chunk_mb``, the transport, ``interface``);
    None: their defaults (tcp, bound to each node's Ray address). ``heartbeat``: ``laminar.heartbeat``, which times
    the group's monitor (``monitor_settings``); the monitor starts with the group, so a dead relay leaves the chain
    (and a replica that joins its node later gets a new one, ``replica_relays``).
    Relays and stores an earlier, crashed run left behind are swept first. Before the group is returned each
    relay's node is checked (``admit_relays``): /dev/shm room for ``version_bytes`` (the preflight's size of one
    version; None skips it) and a connection down each link of the chain; a problem raises, naming node and port.
    """
    import ray

    from verl_laminar.relay.group import DEFAULT_GROUP_NAME, RelayGroup, sweep_stale_relays
    from verl_laminar.relay.store import KEEP_VERSIONS

    name = group_name or DEFAULT_GROUP_NAME
    # relay ids name the host-memory stores: unique per run, so two runs on one host never share a store
    run = uuid.uuid4().hex[:8]
    alive = [n for n in ray.nodes() if n["Alive"]]
    master_node = node_of(trainer_rank0)
    rollout_nodes = None
    if replicas is not None:
        workers = [w for r in replicas for w in r.workers]
        rollout_nodes = set(ray.get([w.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id())
                                     for w in workers]))
        gone = rollout_nodes - {n["NodeID"] for n in alive}
        if gone:
            logger.warning("relay group %s: rollout nodes %s are not alive; no relay there", name, sorted(gone))
    chosen = relay_nodes(alive, rollout_nodes, master_node)
    nodes = {f"relay{i}-{run}": node for i, node in enumerate(chosen)}
    master = next(rid for rid, (nid, _) in nodes.items() if nid == master_node)
    sweep_stale_relays(name, [n["NodeID"] for n in alive])
    keep = relay.keep_versions if relay is not None else KEEP_VERSIONS
    chunk_mb = relay.chunk_mb if relay is not None else None
    transport = relay.transport_spec() if relay is not None else None
    interface = relay.interface if relay is not None else None
    delta = relay.delta if relay is not None else None
    # the chunk count of each broadcast comes from the cost model at the link rate the user states
    link_bytes_per_s = relay.link_gbps * 1e9 / 8 if relay is not None else None
    monitor = monitor_settings(heartbeat)
    from verl_laminar.fleet.helpers import here

    # beside the trainer's loop (hard affinity to this node: it needs no CPU, so it always fits): on a rollout machine its loss took the group with it
    group = ray.remote(RelayGroup).options(name=name, max_concurrency=16, num_cpus=0,
                                           scheduling_strategy=here(soft=False)).remote(name, **monitor)
    plan = ray.get(group.spawn.remote(nodes, master=master, keep_versions=keep, chunk_mb=chunk_mb,
                                      link_bytes_per_s=link_bytes_per_s, transport=transport, interface=interface,
                                      delta=delta))
    admit_relays(group, name, nodes, master, version_bytes, keep)
    ray.get(group.start_monitor.remote())
    logger.info("relay group %s: %d relays (of %d nodes), master %s, keep_versions %d, chunk_mb %s, transport %s, "
                "interface %s, delta %s, chain %s; monitor every %.1f s (a relay silent for %.1f s leaves the chain)",
                name, len(nodes), len(alive), master, keep, chunk_mb, transport_label(transport),
                interface or "node address", delta or "off", plan, monitor["monitor_interval_s"],
                monitor["ping_timeout_s"])
    return group


def admit_relays(group: Any, name: str, nodes: dict[str, tuple[str, str]], master: str,
                 version_bytes: Optional[int], keep: int, timeout_s: Optional[float] = None) -> None:
    """Raise ``RelayAdmissionError`` when a relay's node has too little /dev/shm for the versions it keeps or a
    relay cannot reach its downstream neighbour (``relay/admit.py``). On any failure here the group's relays are
    ended first, and the error that stopped the check is the one raised."""
    import ray

    from verl_laminar.relay import admit
    from verl_laminar.relay.group import relay_actor_name

    timeout_s = admit.REACH_TIMEOUT_S if timeout_s is None else timeout_s
    try:
        actors = {rid: ray.get_actor(relay_actor_name(name, rid)) for rid in nodes}
        infos = dict(zip(actors, ray.get([a.info.remote() for a in actors.values()], timeout=60)))
        sites = {rid: admit.RelaySite(rid, nid, ip, tuple(infos[rid]["address"]), infos[rid]["root"],
                                      infos[rid].get("store_free"), rid == master) for rid, (nid, ip) in nodes.items()}
        links = admit.hops(ray.get(group.plan.remote(), timeout=60).relays)
        # each reach is bounded (connect, then one answer, each within timeout_s); the margin is Ray's own
        answers = dict(zip(links, ray.get([actors[a].reach.remote(sites[b].address, timeout_s) for a, b in links],
                                          timeout=2 * timeout_s + 60)))
        problems = admit.shm_problems(list(sites.values()), version_bytes, keep)
        problems += admit.hop_problems(sites, answers, timeout_s)
        if problems:
            raise admit.admission_error(name, problems)
    except BaseException:
        _end_group(group)
        raise
    logger.info("relay group %s: every relay's /dev/shm holds its versions (%s), every link of the chain answered "
                "(%d links)", name, "checked" if version_bytes else "version size unknown, not checked", len(links))


def _end_group(group: Any) -> None:
    """Best effort: the relays and their stores, then the group actor; a failure here must not hide the cause."""
    import ray

    try:
        ray.get(group.shutdown.remote(), timeout=120)
    except Exception as e:  # noqa: BLE001 - the caller raises the error that matters
        logger.warning("relay group shutdown after a failed start: %s", e)
    finally:
        ray.kill(group)


def transport_label(spec: Optional[Any]) -> str:
    """``tcp``, or ``mooncake/<protocol>[ on <device>]``, for the start-up log of a ``TransportSpec``."""
    if spec is None or spec.kind == "tcp":
        return "tcp"
    return f"mooncake/{spec.protocol}" + (f" on {spec.device}" if spec.device else "")


def replica_relays(group: Any, replicas: list, with_master: bool = False) -> dict:
    """Each replica's machine-local relay actor (the one its CheckpointEngineWorker reads from). Where a replica's
    node has no live relay (a node that joined after the spawn, or whose relay died), the group spawns one there
    first (``RelayGroup.ensure_relay``), so the replica joins with a relay on its machine. ``with_master``: the
    chain's master too, under ``rollout.books.CHAIN_MASTER`` (the router holds versions on it as well)."""
    import ray

    ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")}
    out = {}
    for r in replicas:
        node = node_of(r.workers[0])
        if node not in ips:
            raise RuntimeError(f"replica {r.replica_id}'s node {node} is not an alive Ray node; no relay can start there")
        relay_id = ray.get(group.ensure_relay.remote(node, ips[node]))
        out[r.replica_id] = ray.get_actor(ray.get(group.actor_name.remote(relay_id)))
    if with_master:
        from verl_laminar.rollout.books import CHAIN_MASTER

        out[CHAIN_MASTER] = ray.get_actor(ray.get(group.actor_name.remote(ray.get(group.master.remote()))))
    return out
