"""Split search: how many GPUs train and how many generate, tuned per system and scale (paper, Step 4).

Candidates are whole machines at eighths of the cluster, from the trainer's memory minimum up to
one rollout machine left. Throughput is unimodal in the split (more trainer GPUs speed training and
slow generation), so a golden-section search over the candidates finds the best with few runs; a
split whose trainer alone could not beat the best throughput found (its FLOP-bound rate is an upper
bound for any split) is skipped without simulating it.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Optional

from verl_laminar.sim.costs import min_trainer_gpus
from verl_laminar.sim.params import MODELS, ROLLOUT_TP, SimParams
from verl_laminar.sim.systems import COLOCATED, Result, Setup, default_layout, simulate

logger = logging.getLogger(__name__)


def candidate_splits(model: str, gpus: int, p: SimParams, steps: int = 8) -> list[int]:
    """Trainer GPU counts to try (multiples of a machine)."""
    m = p.network.gpus_per_machine
    lo = min_trainer_gpus(MODELS[model], p)
    hi = gpus - max(m, ROLLOUT_TP[model])
    if lo > hi:
        raise ValueError(f"{gpus} GPUs cannot hold a {model} trainer ({lo} GPUs) and one rollout machine; use more GPUs")
    step = max(m, m * round(gpus / steps / m))
    out = sorted({lo, hi} | {x for x in range(step, hi + 1, step) if x >= lo})
    return out


def trainer_bound(model: str, trainer_gpus: int, p: SimParams) -> float:
    """Tokens/s the trainer alone could sustain: no split does better than this."""
    t = p.training
    return trainer_gpus * p.device.peak_flops * t.mfu / (t.flops_per_param_token * MODELS[model].params)


@dataclass
class SearchResult:
    best: Result
    tried: dict[int, float] = field(default_factory=dict)  # trainer GPUs -> throughput


def best_split(system: str, model: str, task: str, gpus: int, seed: int, p: SimParams,
               trainer_gpus: Optional[int] = None) -> SearchResult:
    """Simulate ``system`` at its best split (or at ``trainer_gpus`` if given)."""
    if system in COLOCATED:
        r = simulate(system, Setup(model, task, default_layout(model, gpus, gpus, p, colocated=True), seed, p))
        return SearchResult(r, {gpus: r.throughput})
    cands = [trainer_gpus] if trainer_gpus else candidate_splits(model, gpus, p)
    runs: dict[int, Result] = {}

    def score(i: int) -> float:
        tg = cands[i]
        if tg not in runs:
            best = max((r.throughput for r in runs.values()), default=0.0)
            if runs and trainer_bound(model, tg, p) <= best:
                return -1.0 / tg  # cannot win; smaller splits are worse still
            runs[tg] = simulate(system, Setup(model, task, default_layout(model, gpus, tg, p), seed, p))
        return runs[tg].throughput

    lo, hi = 0, len(cands) - 1
    inv_phi = (math.sqrt(5) - 1) / 2
    while hi - lo > 2:
        a = hi - round((hi - lo) * inv_phi)
        b = lo + round((hi - lo) * inv_phi)
        if a == b:
            b = a + 1
        if score(a) >= score(b):
            hi = b
        else:
            lo = a
    for i in range(lo, hi + 1):
        score(i)
    best = max(runs.values(), key=lambda r: r.throughput)
    logger.debug("%s %s %s %d GPUs: tried %s", system, model, task, gpus, sorted(runs))
    return SearchResult(best, {k: v.throughput for k, v in sorted(runs.items())})
