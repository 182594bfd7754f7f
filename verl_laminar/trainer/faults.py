"""Fault injection under verl's trainer (``laminar.fault_injection``; testing only): executes the plan of
``policy.faults`` after each step's publication.

    on_step_end(step): land a replica fault armed at the previous step (it strikes before this step publishes
        at the latest) -> publish (the trainer) -> strike(step): arm replica faults, kill the pool, kill the trainer

A replica fault is armed, not struck at once: the trainer drives the next batch's generation only after the step
ends, so the fault waits in a thread until its replica holds work that the fault disturbs (groups that a death
moves or loses; with the pool, a group that can move and two requests that streamed a whole chunk), then strikes
at once. Its processes are found first (and the agent on their node started), because a signal must land within
milliseconds once the work is there.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Any, Callable, Optional

from verl_laminar.policy.faults import Fault, due, plan_from_config

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("LAMINAR_LOGGING_LEVEL", "INFO"))

ARM_WAIT_S = 60.0  # an armed replica fault strikes anyway after this long without work on its replica
# a target must have streamed within this long: a replica already stopped (another fault, not yet failed over) is
# no target (a chaos run aimed its garbage fault at a SIGSTOPped replica, and the strike failed)
STREAMING_WITHIN_S = 5.0
# the trainer kill waits for this many groups whose every response is still running: each response that finishes
# before the killed trainer's clients die is closed in the pool, and its group is generated again, not adopted
KILL_WHOLE_GROUPS = 2
CALL_TIMEOUT_S = 30.0  # a call to a replica that stops meanwhile must not hold the trainer (land_armed joins)


class FaultInjector:
    """``replicas()``: the live replica handles now (replacements included); the router, the pool (or None) and
    the pool's chunk size from the trainer; ``group_size``: responses per prompt (``rollout.n``)."""

    def __init__(self, laminar: Any, router: Any, pool: Any, replicas: Callable[[], list], group_size: int = 1) -> None:
        self.plan = plan_from_config(laminar.fault_injection)
        self._router, self._pool, self._replicas = router, pool, replicas
        self._group_size = int(group_size)
        self._chunk = laminar.pool.flush_tokens
        self._armed: list[tuple[threading.Thread, threading.Event]] = []
        if any(f.replica_fault == "garbage" for f in self.plan) and pool is None:
            raise ValueError("laminar.fault_injection: a garbage replica fault corrupts the streaming server's "
                             "answers, which runs only with laminar.pool.enabled=true and the vllm rollout")
        if any(f.kind == "pool_kill" for f in self.plan) and pool is None:
            raise ValueError("laminar.fault_injection: a pool_kill needs laminar.pool.enabled=true")
        if self.plan:
            logger.warning("laminar.fault_injection: plan %s", ";".join(f.label() for f in self.plan))

    def land_armed(self) -> None:
        """Strike every armed replica fault now (before the next publication)."""
        armed, self._armed = self._armed, []
        for thread, now in armed:
            now.set()
            thread.join()

    def strike(self, step: int) -> None:
        for f in due(self.plan, step):
            if f.replica_fault is not None:
                self._arm(f)
            elif f.kind == "pool_kill":
                self._kill_pool(step)
            elif f.kind == "trainer_kill":
                self._arm_trainer_kill(step)

    # ---- the trainer's kill ----
    def _generating(self) -> Optional[list]:
        """None until some replica is generating: requests in flight, and (with the pool) a whole group whose every
        response has streamed tokens, none moved and none finished (``KILL_WHOLE_GROUPS`` of them); then those
        groups' ids (an empty list without the pool).
        Requests alone are not enough: right after a checkpoint the replicas often run only the tails of groups
        whose other responses already reached the (then lost) buffer, which no restarted trainer can adopt; a crash
        in the middle of generation, as where generation dominates, leaves whole groups that it can (a CI run killed
        at such a tail-only moment and had nothing to adopt)."""
        import ray

        if ray.get(self._router.total_inflight.remote()) == 0:
            return None
        if self._pool is None:
            return []
        whole = self._pool.adoptable_groups(self._group_size, True)
        return whole if len(whole) >= KILL_WHOLE_GROUPS else None

    def _arm_trainer_kill(self, step: int) -> None:
        """A trainer crash strikes while the rollouts generate, as it would where generation dominates (a crash at the
        step's end would find this small workload's replicas idle): armed after the step's checkpoint, it waits until
        a replica generates (at most ARM_WAIT_S), and strikes before the next publication at the latest."""
        now = threading.Event()

        def kill_when_generating() -> None:
            deadline = time.monotonic() + ARM_WAIT_S
            whole: Optional[list] = None
            while not now.is_set() and time.monotonic() < deadline:
                try:
                    whole = self._generating()
                    if whole is not None:
                        break
                except Exception as e:  # noqa: BLE001 - a failed probe must not spare the kill
                    logger.warning("laminar.fault_injection: probing the rollouts before the trainer kill: %r", e)
                    break
                time.sleep(0.05)
            # the groups whole in the pool now: a restarted trainer should adopt these (its log says which it did)
            logger.warning("laminar.fault_injection: killing the trainer process (SIGKILL of PID %d) after step %d "
                           "(groups whole in the pool: %s)", os.getpid(), step, whole)
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)

        thread = threading.Thread(target=kill_when_generating, name="laminar-trainer-kill", daemon=True)
        thread.start()
        self._armed.append((thread, now))

    # ---- replica faults ----
    def _busy(self, replica_id: int) -> bool:
        import ray

        if self._pool is None:
            return ray.get(self._router.open_groups_on.remote(replica_id)) > 0
        movable = ray.get(self._router.movable_groups_on.remote(replica_id))
        return (bool(movable)  # two of their requests still generating, a whole chunk of each in the pool
                and self._pool.streamed_on(replica_id, self._chunk, movable) >= 2
                and self._pool.silence([replica_id]).get(replica_id, STREAMING_WITHIN_S)
                < STREAMING_WITHIN_S)

    def _arm(self, fault: Fault) -> None:
        from verl_laminar.trainer import procs

        live = self._live()
        targets = [r for r in live if fault.replica is None or r.replica_id == fault.replica]
        if not targets:
            logger.error("laminar.fault_injection: %s: no live replica to strike (live: %s); skipped", fault.label(),
                         [r.replica_id for r in live])
            return
        roots: dict[int, list] = {}
        # a signal needs its processes found (and the agents on their nodes started) ahead; a replica dying
        # meanwhile is no target
        if fault.replica_fault != "garbage":
            for r in list(targets):
                try:
                    roots[r.replica_id] = procs.replica_roots(r)
                except Exception as e:  # noqa: BLE001 - the router has not marked it dead yet
                    logger.warning("laminar.fault_injection: %s: replica %d is no target (%r)", fault.label(),
                                   r.replica_id, e)
                    targets.remove(r)
            if not targets:
                logger.error("laminar.fault_injection: %s: no live replica to strike; skipped", fault.label())
                return
        now = threading.Event()

        def strike_when_busy() -> None:
            deadline = time.monotonic() + ARM_WAIT_S
            chosen: Optional[Any] = None
            while chosen is None and not now.is_set():
                chosen = next((r for r in targets if self._busy(r.replica_id)), None)
                if chosen is None:
                    if time.monotonic() > deadline:
                        logger.warning("laminar.fault_injection: %s: no unfinished group on %s for %.0f s; striking "
                                       "anyway", fault.label(), [r.replica_id for r in targets], ARM_WAIT_S)
                        break
                    time.sleep(0.02)
            self._strike_replica(fault, chosen or targets[0], roots)

        thread = threading.Thread(target=strike_when_busy, name="laminar-fault-injection", daemon=True)
        thread.start()
        self._armed.append((thread, now))

    def _strike_replica(self, fault: Fault, replica: Any, roots: dict) -> None:
        import ray

        from verl_laminar.trainer import procs

        try:
            if fault.replica_fault == "garbage":  # it goes on answering, wrongly: the clients' output check fences it
                ray.get(replica.server.laminar_corrupt.remote(), timeout=CALL_TIMEOUT_S)
                logger.warning("laminar.fault_injection: replica %d now answers garbage token ids", replica.replica_id)
            else:
                procs.kill_replica(replica, roots[replica.replica_id], hang=fault.replica_fault == "hang")
        except Exception:  # noqa: BLE001 - it died meanwhile, or the signal missed: skipped, never the trainer's end
            logger.exception("laminar.fault_injection: %s on replica %d failed; skipped", fault.label(),
                             replica.replica_id)

    def _live(self) -> list:
        import ray

        dead = set(ray.get(self._router.dead_replicas.remote()))
        return [r for r in self._replicas() if r.replica_id not in dead]

    # ---- the pool ----
    def _kill_pool(self, step: int) -> None:
        """SIGKILL the process of the pool's shard 0 on its node (with several shards, the others keep serving); a
        thread logs when the restarted shard answers again."""
        from verl_laminar.fleet import node_procs
        from verl_laminar.trainer import procs

        t0, shard = time.monotonic(), self._pool.handles[0]
        ref, _ = procs.kill_actor_process(shard)
        logger.warning("laminar.fault_injection: killed the partial-response pool (SIGKILL of PID %d on node %s) "
                       "after step %d: its shard 0 of %d", ref.pid, ref.node, step, len(self._pool))

        def back() -> None:
            new = node_procs.locate(shard, timeout_s=None)  # Ray holds the call until the restarted actor answers
            logger.warning("laminar.fault_injection: the partial-response pool answers again after %.1f s (PID %d, "
                           "its log replayed)", time.monotonic() - t0, new.pid)

        threading.Thread(target=back, name="laminar-pool-restart", daemon=True).start()
