"""The relay group: spawns one relay actor per machine, owns the chain plan, replaces dead relays.

Dataflow:
    sweep_stale_relays (before a spawn) -> relays of earlier runs whose group is gone are killed, and the
    stores of relays that are gone are removed on every node
    spawn(nodes) -> ray.remote(Relay).options(node affinity, CPU only, named) per node
    plan_chain (pure) -> set_chain on every relay (each relay learns its downstream + all addresses)
    monitor thread: ping every relay -> a dead one is dropped with rebuild_chain (pure; a new master
    when the master died) -> set_chain on the survivors. Relays also reroute by themselves the moment
    a send to their downstream fails, so a broadcast in flight does not wait for the monitor.
Plain class: wrap it with ``ray.remote(RelayGroup).options(name=...)`` at the spawn site so trainer and
rollout workers find it by name.

Lifetimes: nothing here is detached. The group is owned by the process that spawns it (the one running the
trainer) and owns its relays, so Ray's fate sharing ends every relay when the job ends, crashed or not; a relay
outliving its job would pin ``keep_versions`` copies of the model in host memory on every node until someone
noticed.
``shutdown`` stops the relays and removes their stores; after a crash the store directories are what is left
(a SIGKILLed relay cleans nothing), and ``sweep_stale_relays`` at the next start removes them, together with
relays of an earlier version of this code, which were detached.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Iterable, Optional

from verl_laminar.policy.chain import (
    ChainPlan,
    ChainPlanError,
    add_relay,
    fallback_source,
    plan_chain,
    rebuild_chain,
)
from verl_laminar.relay.store import KEEP_VERSIONS
from verl_laminar.relay.transport_spec import TransportSpec

logger = logging.getLogger(__name__)

DEFAULT_GROUP_NAME = "laminar_relay_group"


def relay_actor_name(group: str, relay_id: str) -> str:
    return f"{group}:{relay_id}"


def spawn_relay(group: str, relay_id: str, node_id: str, node_ip: str, namespace: Optional[str] = None,
                num_cpus: float = 0, root: Optional[str] = None, **relay_options: Any) -> Any:
    """Start a CPU-only relay actor pinned to ``node_id`` (hard affinity), named for lookup, owned by the caller.

    ``relay_options`` go to ``Relay`` (``keep_versions``, ``chunk_mb``, ``auto_chunks``, ``link_bytes_per_s``,
    ``chunk_latency_s``, ``transport`` (a ``TransportSpec``), ``interface``).
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from verl_laminar.relay.relay import Relay

    return ray.remote(Relay).options(
        name=relay_actor_name(group, relay_id), namespace=namespace,
        num_cpus=num_cpus, num_gpus=0, max_concurrency=64, max_restarts=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
    ).remote(relay_id, root=root, host=node_ip, port=0, **relay_options)


def stale_relay_actors(named: Iterable[dict], group: str) -> list[tuple[str, str]]:
    """(namespace, name) of the relay actors of ``group`` whose group actor is gone (pure).

    ``named``: ``ray.util.list_named_actors(all_namespaces=True)``. A relay is ``<group>:<relay_id>`` in its job's
    namespace; it is stale when no actor named ``group`` lives in that namespace. The relay id's run suffix alone
    would not do: a concurrent job in another namespace may use the same group name, and its relays are alive.
    """
    named = list(named)
    live_groups = {a["namespace"] for a in named if a["name"] == group}
    prefix = f"{group}:"
    return sorted((a["namespace"], a["name"]) for a in named
                  if a["name"].startswith(prefix) and a["namespace"] not in live_groups)


def sweep_stale_relays(group: str, node_ids: Iterable[str], timeout_s: float = 30.0,
                       base: Optional[str] = None) -> dict:
    """Before a spawn: kill ``group``'s relays left by earlier runs, then remove dead relays' stores on ``node_ids``.

    ``base``: where the stores live (default ``shm_cleanup.relay_store_base()`` on each node). Returns
    ``{"actors": [(namespace, name), ...], "stores": {node_id: [path, ...]}}`` and logs what it removed.
    """
    import ray
    from ray.exceptions import RayError
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from verl_laminar.platform.shm_cleanup import sweep_relay_stores

    stale = stale_relay_actors(ray.util.list_named_actors(all_namespaces=True), group)
    handles = []
    for ns, name in stale:
        try:
            handles.append(ray.get_actor(name, namespace=ns))
        except ValueError:  # gone meanwhile
            continue
        ray.kill(handles[-1], no_restart=True)
    if handles:  # their stores unlock only once their processes have exited
        ray.wait([h.ping.remote() for h in handles], num_returns=len(handles), timeout=timeout_s)
    nodes = list(dict.fromkeys(node_ids))
    refs = {n: ray.remote(sweep_relay_stores).options(
        num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n, soft=False)).remote(base)
        for n in nodes}
    stores: dict[str, list[str]] = {}
    for n, ref in refs.items():
        try:
            stores[n] = ray.get(ref, timeout=timeout_s)
        except RayError as e:  # a node going away (timeouts included)
            logger.warning("relay group %s: could not sweep relay stores on node %s: %s", group, n, e)
    if stale or any(stores.values()):
        logger.info("relay group %s: killed %d relays of earlier runs %s; removed stores of gone relays %s",
                    group, len(stale), stale, {n: p for n, p in stores.items() if p})
    return {"actors": stale, "stores": stores}


class RelayGroup:
    def __init__(self, group: str = DEFAULT_GROUP_NAME, namespace: Optional[str] = None,
                 ping_timeout_s: float = 0.5, monitor_interval_s: float = 0.25) -> None:
        self.group, self.namespace = group, namespace
        self.ping_timeout_s, self.monitor_interval_s = ping_timeout_s, monitor_interval_s
        self._lock = threading.RLock()
        self._actors: dict[str, Any] = {}
        self._nodes: dict[str, str] = {}  # relay id -> node id
        self._addresses: dict[str, tuple[str, int]] = {}
        self._roots: dict[str, str] = {}
        self._plan: Optional[ChainPlan] = None
        self._events: list[dict] = []
        self._before_drop: dict[str, ChainPlan] = {}  # a dropped relay -> the last plan it was in
        self._relay_options: dict[str, Any] = {}  # what spawn gave every relay; replacements get the same
        self._stop = threading.Event()
        self._monitor: Optional[threading.Thread] = None
        self._joining = threading.Lock()  # one ensure_relay at a time: two replicas of one node get one relay
        self._joined = 0

    # ---- membership ----
    def spawn(self, nodes: dict[str, tuple[str, str]], master: Optional[str] = None, chunks: Optional[int] = None,
              keep_versions: int = KEEP_VERSIONS, chunk_mb: Optional[float] = None,
              link_bytes_per_s: Optional[float] = None, chunk_latency_s: Optional[float] = None,
              transport: Optional[TransportSpec] = None, interface: Optional[str] = None,
              delta: Optional[str] = None) -> ChainPlan:
        """Start relays: ``nodes`` maps relay id -> (node id, node ip). Returns the chain plan.

        ``chunks``: a fixed chunk count for every broadcast (tests, benchmarks); None lets each publish pick it
        from ``chunk_mb`` (laminar.relay.chunk_mb) or, when that is None, from the chain cost model with
        ``link_bytes_per_s`` / ``chunk_latency_s`` (None: the defaults in policy.chain). ``keep_versions``:
        laminar.relay.keep_versions, the copies of the model each relay holds at most. ``transport``:
        ``RelayConfig.transport_spec()`` (None: tcp); ``interface``: laminar.relay.interface, the NIC or address
        each relay binds instead of its node ip (None: the node ip). ``delta``: laminar.relay.delta (None: off).
        """
        import ray

        options: dict[str, Any] = {"keep_versions": keep_versions, "chunk_mb": chunk_mb, "auto_chunks": not chunks}
        options.update({k: v for k, v in (("link_bytes_per_s", link_bytes_per_s), ("chunk_latency_s", chunk_latency_s),
                                          ("transport", transport), ("interface", interface), ("delta", delta))
                        if v is not None})
        with self._lock:
            self._relay_options = dict(options)
        handles = {rid: spawn_relay(self.group, rid, nid, ip, self.namespace, **options)
                   for rid, (nid, ip) in nodes.items()}
        infos = ray.get([h.info.remote() for h in handles.values()])
        with self._lock:
            for (rid, h), info in zip(handles.items(), infos):
                self._actors[rid], self._nodes[rid] = h, nodes[rid][0]
                self._addresses[rid], self._roots[rid] = tuple(info["address"]), info["root"]
            plan = plan_chain(self._actors, master=master)
            self._plan = ChainPlan(relays=plan.relays, chunks=chunks or 1)
        self._broadcast_plan()
        return self._plan

    def spawn_replacement(self, relay_id: str, node_id: str, node_ip: str, master: bool = False) -> None:
        """Start a relay with the options ``spawn`` gave the others and ``adopt`` it: a relay on another transport
        could not exchange a single chunk with its neighbours."""
        with self._lock:
            options = dict(self._relay_options)
        self.adopt(relay_id, node_id, spawn_relay(self.group, relay_id, node_id, node_ip, self.namespace, **options),
                   master=master)

    def ensure_relay(self, node_id: str, node_ip: str) -> str:
        """The live relay on ``node_id``, spawned there first (``spawn_replacement``, at the chain's tail) when there
        is none: a node that joined after ``spawn``, or whose relay died. A replica reads each version from the
        relay on its own machine; without one its worker finds no relay to read from."""
        import uuid

        with self._joining:
            found = self.relay_on_node(node_id)
            if found is not None:
                return found
            self._joined += 1
            # unique in this run and across runs: a relay id names its host-memory store
            relay_id = f"relayj{self._joined}-{uuid.uuid4().hex[:8]}"
            self.spawn_replacement(relay_id, node_id, node_ip)
            logger.warning("relay group %s: node %s had no live relay; spawned %s there (chain now %s)", self.group,
                           node_id, relay_id, self._plan.relays if self._plan else ())
            return relay_id

    def relay_options(self) -> dict[str, Any]:
        """The ``Relay`` options of this group's relays (for a relay started by hand, then ``adopt``-ed)."""
        with self._lock:
            return dict(self._relay_options)

    def adopt(self, relay_id: str, node_id: str, handle: Any, master: bool = False) -> None:
        """Add an already running relay (e.g. a restarted one) at the tail of the chain, or as its master.

        It must use this group's transport (``relay_options``; ``spawn_replacement`` starts one that does)."""
        import ray

        info = ray.get(handle.info.remote())
        with self._lock:
            self._actors[relay_id], self._nodes[relay_id] = handle, node_id
            self._addresses[relay_id], self._roots[relay_id] = tuple(info["address"]), info["root"]
            self._plan = add_relay(self._plan, relay_id, master) if self._plan else plan_chain([relay_id])
        self._broadcast_plan()

    def _broadcast_plan(self) -> None:
        import ray

        with self._lock:
            plan, addrs, actors = self._plan, dict(self._addresses), dict(self._actors)
        refs = [actors[r].set_chain.remote(plan, addrs) for r in plan.relays if r in actors]
        ray.wait(refs, num_returns=len(refs), timeout=self.ping_timeout_s * 4)

    # ---- queries (what engines and rollouts ask) ----
    def plan(self) -> Optional[ChainPlan]:
        return self._plan

    def addresses(self) -> dict[str, tuple[str, int]]:
        with self._lock:
            return dict(self._addresses)

    def master(self) -> str:
        if self._plan is None:
            raise ChainPlanError("no relays spawned yet; call RelayGroup.spawn first")
        return self._plan.master

    def relay_on_node(self, node_id: str) -> Optional[str]:
        """The live relay on ``node_id``, the first in chain order (so the master when it runs there)."""
        with self._lock:
            live = self._plan.relays if self._plan else ()
            return next((r for r in live if self._nodes.get(r) == node_id), None)

    def actor_name(self, relay_id: str) -> str:
        return relay_actor_name(self.group, relay_id)

    def root(self, relay_id: str) -> str:
        return self._roots[relay_id]

    def fallback_for(self, relay_id: str) -> tuple[str, tuple[str, int]]:
        """Where rollouts on ``relay_id``'s machine pull while that relay is gone: (relay id, address)."""
        with self._lock:
            old = self._before_drop.get(relay_id, self._plan)
            alive = [r for r in self._plan.relays if r != relay_id]
            src = fallback_source(old, relay_id, alive)
            return src, self._addresses[src]

    def events(self) -> list[dict]:
        with self._lock:
            return list(self._events)

    def delta_stats(self, timeout_s: float = 2.0) -> dict[str, int]:
        """``Relay.delta_stats`` summed over the chain's relays that answer within ``timeout_s`` (cumulative)."""
        import ray

        with self._lock:
            refs = [self._actors[r].delta_stats.remote() for r in (self._plan.relays if self._plan else ())]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        total: dict[str, int] = {}
        for ref in ready:
            try:
                for k, v in ray.get(ref).items():
                    total[k] = total.get(k, 0) + v
            except ray.exceptions.RayActorError:  # died since: its counts are gone with it
                continue
        return total

    # ---- failure handling ----
    def check(self) -> list[str]:
        """Ping every relay in the chain; drop the dead ones and push the rebuilt plan. Returns the dropped."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        with self._lock:
            if self._plan is None:
                return []
            members = [(r, self._actors[r]) for r in self._plan.relays]
        t0 = time.time()
        refs = {r: h.ping.remote() for r, h in members}
        dead = []
        for r, ref in refs.items():
            try:
                ray.get(ref, timeout=max(0.05, self.ping_timeout_s - (time.time() - t0)))
            except (RayActorError, GetTimeoutError):
                dead.append(r)
        if dead:
            with self._lock:
                gone = [r for r in dead if r in self._plan.relays]
                if len(gone) == len(self._plan.relays):
                    logger.error("relay group %s: every relay is gone; nothing to rebuild", self.group)
                    return gone
                old = self._plan
                self._plan = rebuild_chain(old, gone)
                self._before_drop.update({r: old for r in gone})
                self._events.append({"event": "chain_rebuilt", "dropped": gone, "t_detect": time.time(),
                                     "master_changed": old.master != self._plan.master,
                                     "chain": list(self._plan.relays)})
            self._broadcast_plan()
            with self._lock:
                self._events[-1]["t_rebuilt"] = time.time()
            logger.warning("relay group %s dropped %s; chain now %s", self.group, dead, self._plan.relays)
        return dead

    def start_monitor(self) -> None:
        if self._monitor is None:
            self._monitor = threading.Thread(target=self._monitor_loop, name="relay-group-monitor", daemon=True)
            self._monitor.start()

    def _monitor_loop(self) -> None:
        while not self._stop.wait(self.monitor_interval_s):
            self.check()

    def shutdown(self, destroy: bool = True) -> None:
        """Stop the monitor and every relay (their stores removed when ``destroy``)."""
        import ray
        from ray.exceptions import RayActorError
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self._stop.set()
        with self._lock:
            actors, nodes, roots = dict(self._actors), dict(self._nodes), dict(self._roots)
            self._actors.clear()
        leftovers = []
        for rid, h in actors.items():
            try:
                ray.get(h.close.remote(destroy), timeout=5)
            except (RayActorError, ray.exceptions.GetTimeoutError):
                leftovers.append(rid)  # a dead relay's files stay on its machine: remove them there
            ray.kill(h)
        if destroy:
            # on each machine: the stores of its relays that died (dropped earlier, or found dead just now) and what
            # its workers pulled while one was dead (relay.node_pull), each only if no live process holds it
            dead = set(leftovers) | (set(nodes) - set(actors))
            by_node: dict[str, tuple[list[str], list[str]]] = {}
            for rid, node in nodes.items():
                stores, pulled = by_node.setdefault(node, ([], []))
                if rid in dead and rid in roots:
                    stores.append(roots[rid])
                pulled.append(rid)
            refs = [ray.remote(_remove_leftovers).options(
                num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False)
            ).remote(stores, pulled) for node, (stores, pulled) in by_node.items()]
            ray.wait(refs, num_returns=len(refs), timeout=10)


def _remove_store(root: str) -> bool:
    """A dead relay's store, on its machine; left alone if a live relay (a restarted one) holds it."""
    import os

    from verl_laminar.platform.shm_cleanup import remove_unused_store

    removed = remove_unused_store(root)
    try:  # the shared parent goes with its last store
        os.rmdir(os.path.dirname(root))
    except OSError:
        pass
    return removed


def _remove_leftovers(stores: list[str], pulled_for: list[str], base: Optional[str] = None) -> list[str]:
    """On one machine: the ``stores`` of dead relays and the shared pulls made for relays ``pulled_for``
    (``node_pull.shared_pull_root``, under ``base``); returns what was removed."""
    from verl_laminar.relay.node_pull import shared_pull_root

    paths = list(stores) + [shared_pull_root(rid, base) for rid in pulled_for]
    return [p for p in paths if _remove_store(p)]
