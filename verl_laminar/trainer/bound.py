"""The trainer's half of ``laminar.buffer.max_staleness`` (``policy.bound``): before it publishes version v it waits
until no open training group has a version below v - k. The router admits none meanwhile, so the wait ends as those
groups finish; a router that stops ends it with its cause (the health check), and a long wait is logged with the
groups it waits for, never silent."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional

logger = logging.getLogger("verl_laminar.trainer.laminar_trainer")

POLL_S = 0.2
LOG_EVERY_S = 30.0


def wait_to_publish(router: Any, version: int, k: Optional[int], health: Callable[[], None],
                    get: Optional[Callable[[Any], Any]] = None, clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep) -> float:
    """Block until ``version`` may be published within the bound ``k``; returns the seconds waited (0 when
    unbounded). ``health`` raises if the rollouts stopped (``LaminarTrainer._rollouts_run``)."""
    if k is None:
        return 0.0
    if get is None:
        import ray

        get = ray.get
    t0 = logged = clock()
    held = False  # some poll found groups blocking: only then is the wait worth a line
    while True:
        blocking = get(router.hold_publish.remote(int(version)))
        if not blocking:
            waited = clock() - t0
            if held:
                logger.info("laminar: version %d published after %.1f s waiting for the groups older than the "
                            "staleness bound %d", version, waited, k)
            return waited
        held = True
        health()
        now = clock()
        if now - logged >= LOG_EVERY_S:
            logged = now
            logger.warning("laminar: version %d waits %.0f s for %d open groups older than %d (max_staleness=%d), "
                           "oldest (group, replica, version): %s", version, now - t0, len(blocking),
                           version - k, k, blocking[:5])
        sleep(POLL_S)
