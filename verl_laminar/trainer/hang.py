"""The hang watch: under ``+laminar=enabled`` with the partial-response pool, a replica that holds requests and
streams nothing is hung, and is killed so that its requests fail over like a dead replica's.

A SIGKILLed replica is found by its failed requests (``rollout.router_failover``). A hung one (a stuck engine,
a stopped process, a wedged device) fails nothing: its requests wait forever and its groups with them. Its
heartbeat is its token stream: every request opens a pool entry and streams chunks into it
(``rollout.streaming_server``), so the pool knows when each replica last made progress (``PartialPool.silence``).
Every ``laminar.heartbeat.interval_s`` this watch asks the router which replicas hold requests and the pool how
long each has been silent; ``policy.failover.hung_replicas`` judges; a hung replica's processes are SIGKILLed
by PID (found when the watch starts), and the usual failover follows: its requests fail with an actor error,
the router moves its groups, they continue from the pool.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable, Optional

from verl_laminar.policy.failover import HeartbeatPolicy, hung_replicas

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("LAMINAR_LOGGING_LEVEL", "INFO"))


class HangWatch:
    """``busy()``: the replicas with requests in flight (the router's ``busy_replicas``); ``silence()``: seconds
    since each replica's last progress (the pool's); ``kill(replica_id)``: end it. Pure of Ray: the trainer
    passes the calls."""

    def __init__(self, policy: HeartbeatPolicy, busy: Callable[[], list], silence: Callable[[], dict],
                 kill: Callable[[int], None], clock: Callable[[], float] = time.monotonic,
                 track: Optional[Callable[[Any], None]] = None) -> None:
        self.policy, self._busy, self._silence, self._kill, self._clock = policy, busy, silence, kill, clock
        self._track = track
        self._busy_since: dict[int, float] = {}
        self.hung: list[int] = []  # replicas this watch killed, in order
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def check(self) -> list[int]:
        """One look: the replicas found hung now (each is killed, once)."""
        now = self._clock()
        busy = set(int(r) for r in self._busy()) - set(self.hung)
        # busy without a break since when (this clock): a replica that just took requests after idling has
        # a long pool silence but is not hung
        self._busy_since = {r: self._busy_since.get(r, now) for r in busy}
        found = hung_replicas({r: now - t for r, t in self._busy_since.items()},
                              {int(r): float(s) for r, s in self._silence().items()}, self.policy)
        for rid in found:
            logger.error("laminar: replica %d is hung: requests in flight for %.1f s and nothing streamed for as "
                         "long (laminar.heartbeat.dead_after_s=%s); killing it so that its groups fail over", rid,
                         now - self._busy_since[rid], self.policy.dead_after_s)
            self.hung.append(rid)
            self._busy_since.pop(rid, None)
            self._kill(rid)
        return found

    def track(self, replica: Any) -> None:
        """Watch a replica that joined after the start (a replacement): ``kill`` must be able to end it."""
        if self._track is not None:
            self._track(replica)

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


def start_hang_watch(laminar: Any, router: Any, pool: Any, replicas: list) -> Optional[HangWatch]:
    """The watch over verl's replicas (None without the pool: then there is no token stream to watch)."""
    if pool is None:
        return None
    import ray

    from verl_laminar.trainer import runtime

    by_id: dict[int, Any] = {}
    roots: dict[int, list[int]] = {}

    def track(replica: Any) -> None:
        # a hung server cannot answer the calls that find its PIDs, so the roots are found now; their children
        # (vLLM's engine core, started later too) when it is killed
        by_id[replica.replica_id] = replica
        roots[replica.replica_id] = runtime.local_roots(replica)

    for r in replicas:
        track(r)

    def kill(rid: int) -> None:
        replica = by_id[rid]
        if roots[rid]:
            runtime.kill_replica(replica, runtime.process_tree(roots[rid]), why="laminar hang watch")
        for actor in (replica.server, *replica.workers):  # on other nodes Ray kills them (SIGKILL there)
            try:
                ray.kill(actor, no_restart=True)
            except Exception as e:  # already gone
                logger.debug("laminar: hang watch: ray.kill of a replica %d actor: %r", rid, e)

    policy = HeartbeatPolicy(laminar.heartbeat.interval_s, laminar.heartbeat.dead_after_s)
    watch = HangWatch(policy, lambda: ray.get(router.busy_replicas.remote()), lambda: ray.get(pool.silence.remote()),
                      kill, track=track)
    logger.info("laminar: hang watch on (a replica holding requests with nothing streamed for %.1f s is killed)",
                policy.dead_after_s)
    return watch.start()
