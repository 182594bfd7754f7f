"""The hang watch: under ``+laminar=enabled`` with the partial-response pool, a replica that holds requests and
streams nothing is hung, and is killed so that its requests fail over like a dead replica's.

A SIGKILLed replica is found by its failed requests (``rollout.router_failover``). A hung one (a stuck engine,
a stopped process, a wedged device) fails nothing: its requests wait forever and its groups with them. Its
heartbeat is its token stream: every request opens a pool entry and streams chunks into it
(``rollout.streaming_server``), so the pool knows when each replica last made progress (``PartialPool.silence``).
Every ``laminar.heartbeat.interval_s`` this watch asks the router which replicas hold requests and the pool how
long each has been silent; ``policy.failover.hung_replicas`` judges; a hung replica's processes are SIGKILLed
on their nodes (found when the watch starts tracking it), and the usual failover follows: its requests fail with an actor error,
the router moves its groups, they continue from the pool.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable, Optional

from verl_laminar.policy.failover import HeartbeatPolicy, hung_replicas, unanswered_replicas

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("LAMINAR_LOGGING_LEVEL", "INFO"))


class HangWatch:
    """``busy()``: the replicas with requests in flight (the router's ``busy_replicas``); ``silence(replicas)``:
    seconds since each of them last made progress (the pool's); ``kill(replica_id)``: end it. Idle replicas are
    pinged: ``live()`` gives the live ones, ``ping_waits(idle)`` how long each one's unanswered ping has waited
    (``PingProbe``). Pure of Ray: the trainer passes the calls."""

    def __init__(self, policy: HeartbeatPolicy, busy: Callable[[], list], silence: Callable[[list], dict],
                 kill: Callable[[int], None], clock: Callable[[], float] = time.monotonic,
                 live: Optional[Callable[[], list]] = None,
                 ping_waits: Optional[Callable[[list], dict]] = None) -> None:
        self.policy, self._busy, self._silence, self._kill, self._clock = policy, busy, silence, kill, clock
        self._live, self._ping_waits = live, ping_waits
        self._busy_since: dict[int, float] = {}
        self.hung: list[int] = []  # replicas this watch killed, in order
        self._clocked: set[int] = set()  # replicas seen streaming
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def check(self) -> list[int]:
        """One look: the replicas found hung now (each is killed, once)."""
        now = self._clock()
        busy = set(int(r) for r in self._busy()) - set(self.hung)
        # busy without a break since when (this clock): a replica that just took requests after idling has
        # a long pool silence but is not hung
        self._busy_since = {r: self._busy_since.get(r, now) for r in busy}
        silence = {int(r): float(s) for r, s in self._silence(sorted(busy)).items()}
        for rid in sorted(set(silence) - self._clocked):
            # how long a replica's first tokens took (a cold engine): what first_token_after_s must cover
            self._clocked.add(rid)
            logger.info("laminar: replica %d streams: its first token within %.1f s of its requests", rid,
                        now - self._busy_since[rid])
        found = hung_replicas({r: now - t for r, t in self._busy_since.items()}, silence, self.policy)
        for rid in found:
            logger.error("laminar: replica %d is hung: requests in flight for %.1f s and nothing streamed for as "
                         "long (laminar.heartbeat.dead_after_s=%s); killing it so that its groups fail over", rid,
                         now - self._busy_since[rid], self.policy.dead_after_s)
            self._end(rid)
        if self._live is not None and self._ping_waits is not None:
            idle = sorted(set(int(r) for r in self._live()) - busy - set(self.hung))
            waits = self._ping_waits(idle)
            for rid in unanswered_replicas(waits, self.policy):
                logger.error("laminar: replica %d is hung: idle, and its server has not answered a ping for %.1f s "
                             "(%.0f x laminar.heartbeat.dead_after_s); killing it so that it is replaced", rid,
                             waits[rid], self.policy.ping_after_s / self.policy.dead_after_s)
                self._end(rid)
                found.append(rid)
        return found

    def _end(self, rid: int) -> None:
        self.hung.append(rid)
        self._busy_since.pop(rid, None)
        self._kill(rid)

    def _run(self) -> None:
        while not self._stop.wait(self.policy.interval_s):
            try:
                self.check()
            except Exception:  # a failed look (the router or pool restarting) must not end the watch
                logger.exception("laminar: hang watch: one look failed; trying again in %.1f s",
                                 self.policy.interval_s)

    def start(self) -> "HangWatch":
        self._thread = threading.Thread(target=self._run, name="laminar-hang-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.policy.interval_s + 5.0)


class PingProbe:
    """Pings without blocking the watch: ``ping_waits(replicas)`` sends a ping to each replica that has none out and
    returns how long each one's outstanding ping has waited (0 for one just sent). ``send(rid)``: a future (Ray's
    ``__ray_ready__`` of the replica's server, as the router's probe; a stopped process never answers it);
    ``ready(futures)``: those answered, or failed (a dead replica is the router's to handle, not a hang)."""

    def __init__(self, send: Callable[[int], Any], ready: Optional[Callable[[list], set]] = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._send, self._ready, self._clock = send, ready or _ray_ready, clock
        self._out: dict[int, tuple[Any, float]] = {}

    def __call__(self, replicas: list) -> dict[int, float]:
        now = self._clock()
        if self._out:
            done = self._ready([ref for ref, _ in self._out.values()])
            self._out = {rid: (ref, t) for rid, (ref, t) in self._out.items() if ref not in done}
        for rid in replicas:
            if rid not in self._out:
                self._out[rid] = (self._send(rid), now)
        return {rid: now - self._out[rid][1] for rid in replicas}


def _ray_ready(refs: list) -> set:
    import ray

    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
    return set(ready)


class ReplicaKiller:
    """Ends a replica's processes: each process tree on its own node (``trainer.procs.kill_replica``), then
    ``ray.kill`` of its actors. The roots are found when a replica is tracked, because a hung server cannot answer
    the calls that find them; their children (vLLM's engine core, started later too) at kill time, on the node."""

    def __init__(self, replicas: list) -> None:
        self._by_id: dict[int, Any] = {}
        self._roots: dict[int, list] = {}
        for r in replicas:
            self.track(r)

    def tracked(self) -> list[int]:
        return sorted(self._by_id)

    def server(self, rid: int) -> Any:
        return self._by_id[rid].server

    def track(self, replica: Any) -> None:
        from verl_laminar.trainer import procs

        self._by_id[replica.replica_id] = replica
        self._roots[replica.replica_id] = procs.replica_roots(replica)
        # where it runs, by the node's address: what a machine's loss takes is read from these lines
        logger.info("laminar: replica %d runs on node %s", replica.replica_id,
                    ", ".join(procs.node_addresses(sorted({r.node for r in self._roots[replica.replica_id]}))))

    def kill(self, rid: int, why: str) -> None:
        import ray

        from verl_laminar.trainer import procs

        replica = self._by_id[rid]
        try:
            # a root that died long ago may have left its PID to another process: the node's side signals only
            # the same process (PID and start time)
            procs.kill_replica(replica, self._roots[rid], why=why)
        except Exception as e:  # noqa: BLE001 - already gone, or its node is: ray.kill below still ends the actors
            logger.info("laminar: %s: replica %d: no process tree left to kill (%r)", why, rid, e)
        for actor in (replica.server, *replica.workers):
            try:
                ray.kill(actor, no_restart=True)
            except Exception as e:  # noqa: BLE001 - already gone
                logger.debug("laminar: %s: ray.kill of a replica %d actor: %r", why, rid, e)


def start_hang_watch(laminar: Any, router: Any, pool: Any, killer: ReplicaKiller) -> Optional[HangWatch]:
    """The watch over verl's replicas (None without the pool: then there is no token stream to watch)."""
    if pool is None:
        return None
    import ray

    policy = HeartbeatPolicy(laminar.heartbeat.interval_s, laminar.heartbeat.dead_after_s)

    def live() -> list:
        dead = set(ray.get(router.dead_replicas.remote()))
        return [rid for rid in killer.tracked() if rid not in dead]

    watch = HangWatch(policy, lambda: ray.get(router.busy_replicas.remote()), pool.silence,
                      lambda rid: killer.kill(rid, "laminar hang watch"), live=live,
                      ping_waits=PingProbe(lambda rid: killer.server(rid).__ray_ready__.remote()))
    logger.info("laminar: hang watch on (a replica holding requests with nothing streamed for %.1f s, or an idle one "
                "whose server leaves a ping unanswered for %.1f s, is killed)", policy.dead_after_s,
                policy.ping_after_s)
    return watch.start()
