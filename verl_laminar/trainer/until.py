"""``laminar.run_until`` under verl's trainer: the glue between ``policy.until`` and ``LaminarTrainer``.

verl's fit loop runs while ``global_steps <= total_training_steps``; a step after which every awaited event
happened lowers ``total_training_steps`` to that step, so the loop ends there and calls ``on_train_end`` (the
run's clean end, exit 0). A bound reached first ends the Laminar side cleanly, then raises ``AwaitedEventMissing``
out of the step: the job fails with that message.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, Iterable, Mapping, Optional

from verl_laminar.policy.adopt import ADOPTED_REPLICA
from verl_laminar.policy.until import AwaitedEventMissing, RunUntil, StepFacts, deadline, earliest_end

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("LAMINAR_LOGGING_LEVEL", "INFO"))


def start(laminar: Any, replica_ids: Iterable[int], start_version: int, cap_step: int, fault_plan: Iterable[Any],
          started_s: float) -> Optional[RunUntil]:
    """The run's awaited events (None when ``laminar.run_until.events`` is empty). ``started_s``: the trainer's
    start on the monotonic clock (the time bound counts from it)."""
    cfg = laminar.run_until
    if not cfg.events:
        return None
    until = RunUntil(events=tuple(cfg.events), initial=frozenset(int(r) for r in replica_ids),
                     start_version=int(start_version), adopted_replica=ADOPTED_REPLICA, cap_step=int(cap_step),
                     deadline_s=deadline(started_s, cfg.timeout_s),
                     min_step=earliest_end((f.step for f in fault_plan), int(start_version), cfg.min_steps))
    logger.warning("laminar.run_until: the run ends once %s happened (no earlier than step %d), at step %d or %.0f s "
                   "after the trainer's start at the latest", ", ".join(until.events), until.min_step, cap_step,
                   cfg.timeout_s)
    return until


def ends_after(until: RunUntil, step: int, trained: Iterable[Any], loaded: Mapping[int, int],
               shutdown: Callable[[], None], clock: Callable[[], float] = time.monotonic) -> bool:
    """True: the run ends after ``step`` (every event seen). ``trained``: the step's TrajectoryRecords;
    ``loaded``: the newest version per replica. A bound reached first runs ``shutdown`` and raises."""
    facts = StepFacts(int(step), frozenset(int(r.replica_id) for r in trained), dict(loaded))
    try:
        end = until.after_step(facts, clock())
    except AwaitedEventMissing as e:
        logger.error("%s", e)
        shutdown()  # nothing of the Laminar side outlives the failed run (relays, detached fleet, pool)
        raise
    if end:
        logger.warning("%s", until.summary(int(step)))
    return end
