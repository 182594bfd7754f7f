"""The router's events applied on the trainer's side, once per step: the ledger (one version per trajectory and
group, nothing trained twice), the fault-tolerance and fleet counters (``laminar/ft/*``, ``laminar/fleet/*``) and
the run's timeline. The events are the typed ones of ``rollout.events``; nothing else crosses."""

from __future__ import annotations

import logging
from typing import Optional

from verl_laminar import timeline as tl
from verl_laminar.policy.accounting import Accounting, InvariantViolation, TrajectoryRecord
from verl_laminar.policy.adopt import ADOPTED_REPLICA
from verl_laminar.rollout.events import RouterEvents

logger = logging.getLogger("verl_laminar.trainer.laminar_trainer")  # the run's per-step record, as before


def apply_router_events(events: RouterEvents, accounting: Accounting, ft: dict, fleet: dict,
                        timeline: Optional[tl.TimelineWriter]) -> None:
    """Raises ``InvariantViolation`` if a rollout worker reported one."""
    if not isinstance(events, RouterEvents):
        raise TypeError(f"the router sent {type(events).__name__}, not rollout.events.RouterEvents")
    if events.violations:
        raise InvariantViolation(f"{len(events.violations)} rollout invariant violations, first: "
                                 f"{events.violations[0].message}")
    ledger = accounting.ledger
    for e in events.started:
        ledger.start(e.key, e.group_id, e.replica_id, e.version)
    for e in events.finished:
        if e.replica_id == ADOPTED_REPLICA:  # generated while the previous trainer was down (policy.adopt)
            fleet["adopted"] += 1
            fleet["adopted_tokens"] += e.response_tokens
        start = e.start_s if e.start_s is not None else e.finish_s
        ledger.finish(TrajectoryRecord(e.key, e.group_id, e.replica_id, e.version, min(start, e.finish_s),
                                       e.finish_s, e.prompt_tokens, e.response_tokens, e.n))
    for f in events.failures:
        ft["failures"] += 0 if f.followup else 1  # a follow-up: parked groups lost later
        ft["moved"] += len(f.moved)
        ft["parked"] += len(f.parked)
        ft["lost"] += len(f.lost)
        for group_id, n in f.lost:
            # verl fails the group and refills the batch: its trajectories are dropped, not lost
            for i in range(n):
                ledger.discard(f"{group_id}_{i}", f"replica {f.replica_id} died")
        logger.error("laminar: replica %s died (%s); groups moved %s, lost %s, parked for its replacement %s",
                     f.replica_id, f.error, list(f.moved), list(f.lost), list(f.parked))
    for a in events.adopted:
        ft["moved"] += len(a.groups)
        logger.warning("laminar: replica %d loaded version %d for the %d groups parked on it: they continue there",
                       a.replica_id, a.version, len(a.groups))
    for c in events.continued:
        ft["continued"] += 1
        ft["continued_tokens"] += c.tokens
        logger.warning("laminar: request %s of group %s continued from the pool after %d tokens", c.request_id,
                       c.group_id, c.tokens)
    for v in events.loaded:
        accounting.replicas.record(v.replica_id, v.version, v.finish_s)
        logger.info("laminar: replica %d loaded version %d", v.replica_id, v.version)
    if timeline is not None:
        timeline.write(tl.records_from_events(events))
