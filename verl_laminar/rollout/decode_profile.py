"""B for repack on a CPU host, measured on one of the run's own replicas at start-up.

B (``policy.repack``) is the most sequences a repack target may hold: up to B, a merged tail costs the target about
what a lone tail pays per decode step. On a GPU it is the roofline ridge of the device (``config.prepare``). A CPU
has no such datasheet point (what vLLM-CPU reaches depends on the ISA, the cores the replicas share and the model),
so the trainer times the replica it got:

    replica 0's server, before any request of the run (its weights may still be the dummy ones: the cost of a
    decode step does not depend on their values) -> for b in BATCHES (capped at max_num_seqs): b untagged
    requests of exactly T_LONG and then T_SHORT new tokens (min_tokens = max_tokens, no EOS), the difference
    over T_LONG - T_SHORT is the decode step with b sequences, free of prefill -> the median of REPEATS
    -> policy.roofline.crossover_batch_from_profile (the rule bench.repack and bench.decode_profile use)

Untagged requests bypass the partial-response pool and the router (``streaming_server.StreamingEngine``). It costs a
few seconds of start-up; ``laminar.repack.max_batch_b`` set skips it.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from verl_laminar.policy.roofline import crossover_batch_from_profile

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("LAMINAR_LOGGING_LEVEL", "INFO"))  # the B a run measured is part of its record

PROMPT = [1, 2, 3] + [16] * 16  # ids every vocabulary has (bench.decode_profile's prompt)


@dataclass(frozen=True)
class ProfilePlan:
    batches: tuple[int, ...] = (1, 2, 4, 8, 16)
    t_short: int = 4
    t_long: int = 20
    repeats: int = 3

    def capped(self, max_num_seqs: int) -> "ProfilePlan":
        """Batches a replica can run at once; 1 and two more are needed for the slope."""
        kept = tuple(b for b in self.batches if b <= max_num_seqs)
        if len(kept) < 3:
            raise ValueError(f"actor_rollout_ref.rollout.max_num_seqs={max_num_seqs}: the decode profile that sets "
                             f"repack's B needs 3 batch sizes of {self.batches}; set laminar.repack.max_batch_b")
        return ProfilePlan(kept, self.t_short, self.t_long, self.repeats)


def measure(run: Callable[[int, int], float], plan: ProfilePlan) -> dict[int, float]:
    """Seconds per decode step by batch size; ``run(b, n)`` generates b sequences of exactly n tokens at once and
    returns the seconds it took."""
    if plan.t_long <= plan.t_short:
        raise ValueError(f"t_long ({plan.t_long}) must exceed t_short ({plan.t_short})")
    run(1, plan.t_short)  # the first request pays the engine's warm-up
    out: dict[int, float] = {}
    for b in plan.batches:
        steps = [(run(b, plan.t_long) - run(b, plan.t_short)) / (plan.t_long - plan.t_short)
                 for _ in range(plan.repeats)]
        out[b] = statistics.median(steps)
    return out


def server_runner(server: Any, timeout_s: float = 300.0) -> Callable[[int, int], float]:
    """``run(b, n)`` on a verl vLLM server actor (its ``generate``: prompt ids, sampling params, request id)."""
    import ray

    def run(b: int, n: int) -> float:
        params = {"max_tokens": n, "min_tokens": n, "ignore_eos": True, "temperature": 1.0}
        t0 = time.perf_counter()
        ray.get([server.generate.remote(prompt_ids=list(PROMPT), sampling_params=dict(params),
                                        request_id=f"laminar-profile-{uuid.uuid4().hex[:12]}") for _ in range(b)],
                timeout=timeout_s)
        return time.perf_counter() - t0

    return run


def replica_b(server: Any, max_num_seqs: int, plan: ProfilePlan = ProfilePlan()) -> int:
    """B measured on ``server`` (a replica's server actor), logged with its profile."""
    t0 = time.monotonic()
    profile = measure(server_runner(server), plan.capped(max_num_seqs))
    b = crossover_batch_from_profile(profile)
    logger.info("laminar.repack: B = %d from replica 0's decode profile (ms per step by batch: %s; %.1f s; set "
                "laminar.repack.max_batch_b to fix it)", b,
                {k: round(1000 * v, 2) for k, v in sorted(profile.items())}, time.monotonic() - t0)
    return b
