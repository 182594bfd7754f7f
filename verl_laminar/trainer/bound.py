"""The trainer's half of ``laminar.buffer.max_staleness`` (``policy.bound``): each step asks the router which of the
complete groups to train (``LaminarRouter.plan_batch``: earliest deadline first), and waits while the router says a
group still generating must go first. The wait ends as that group finishes; a router that stops ends it with its
cause (the replay buffer's health check), and a long wait is logged, never silent."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional

logger = logging.getLogger("verl_laminar.trainer.laminar_trainer")

LOG_EVERY_S = 30.0


class BatchPlanner:
    """``LaminarReplayBuffer``'s planner: (step, ready, dropped, size) -> the groups to train, or None to wait."""

    def __init__(self, router: Callable[[], Any], k: int, get: Optional[Callable[[Any], Any]] = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._router, self.k, self._get, self._clock = router, int(k), get, clock
        self.wait_s = 0.0  # laminar/staleness/bound_wait_s: time a step had a full batch ready and waited
        self._since: Optional[float] = None
        self._logged = 0.0

    def __call__(self, step: int, ready: list, dropped: list, size: Optional[int] = None) -> Optional[list]:
        get = self._get
        if get is None:
            import ray

            get = ray.get
        chosen = get(self._router().plan_batch.remote(int(step), list(ready), list(dropped), size))
        now = self._clock()
        if chosen is None:
            if self._since is None:
                self._since = self._logged = now
            elif now - self._logged >= LOG_EVERY_S:
                self._logged = now
                logger.warning("laminar: step %d waits %.0f s for groups still generating that are due sooner than "
                               "the %d complete ones (max_staleness=%d)", step, now - self._since, len(ready), self.k)
            return None
        if self._since is not None:
            waited, self._since = now - self._since, None
            self.wait_s += waited
            logger.info("laminar: step %d took its batch after %.1f s waiting for groups due sooner "
                        "(max_staleness=%d)", step, waited, self.k)
        return chosen
