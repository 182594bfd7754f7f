"""Split search: how many GPUs train and how many generate, tuned per system and scale (paper, Step 4).

Candidates are whole machines at eighths of the cluster, from the trainer's memory minimum up to
one rollout machine left. Throughput is unimodal in the split (more trainer GPUs speed training and
slow generation), so a hill climb finds the best with few runs: start in the middle, let the
trainer's idle time say which way to go (an idle trainer waits for data: give rollouts more GPUs),
and step while throughput improves. A split whose trainer alone could not beat the best throughput
found (its FLOP-bound rate caps any split) is not simulated.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Optional

from verl_laminar.sim.costs import min_trainer_gpus
from verl_laminar.sim.params import MODELS, ROLLOUT_TP, SimParams
from verl_laminar.sim.systems import COLOCATED, Result, Setup, default_layout, simulate

logger = logging.getLogger(__name__)


IDLE_HINT = 0.05  # a trainer idle more than this waits for data


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


def _score_split(tg: int, runs: dict[int, Result], system: str, model: str, task: str, gpus: int, seed: int,
                 p: SimParams) -> float:
    """Throughput at ``tg`` trainer GPUs (memoized in ``runs``); -1 when the trainer alone cannot win."""
    if tg not in runs:
        best = max((r.throughput for r in runs.values()), default=0.0)
        if runs and trainer_bound(model, tg, p) <= best:
            return -1.0  # cannot win
        runs[tg] = simulate(system, Setup(model, task, default_layout(model, gpus, tg, p), seed, p))
    return runs[tg].throughput


def _refine(cands: list[int], runs: dict[int, Result], score_at, machine: int, lo: int, hi: int) -> None:
    """Narrow the coarse optimum down to whole machines.

    The coarse grid (eighths of the cluster) leaves up to an eighth of the cluster between the best
    split and its neighbours -- 128 GPUs at 1,024 -- and two systems whose rollouts differ in
    efficiency can land on the same coarse point, both held to the trainer's rate there. The paper
    tuned each split (Step 4), so the search halves its step around the best split until it is one
    machine, moving while throughput improves: about log2(cluster / 8 / machine) extra runs per side.
    """
    best = max(runs, key=lambda k: runs[k].throughput)
    i = cands.index(best) if best in cands else 0
    gaps = [abs(cands[j] - best) for j in (i - 1, i + 1) if 0 <= j < len(cands)]
    step = (max(gaps) if gaps else machine) // 2
    step = machine * max(1, round(step / machine)) if step >= machine else 0
    while step >= machine:
        here = runs[best].throughput
        moved = False
        idle = runs[best].trainer_idle_frac or 0.0
        # an idle trainer waits for data: give rollouts more GPUs first
        for d in ((-step, step) if idle > IDLE_HINT else (step, -step)):
            tg = best + d
            if lo <= tg <= hi and score_at(tg) > here:
                best, moved = tg, True
                break
        if not moved:
            step = machine * (step // machine // 2) if step >= 2 * machine else 0


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
        return _score_split(cands[i], runs, system, model, task, gpus, seed, p)

    i = (len(cands) - 1) // 2
    here = score(i)
    idle = runs[cands[i]].trainer_idle_frac or 0.0
    first = -1 if idle > IDLE_HINT else 1
    for step in (first, -first):
        j = i
        while 0 <= j + step < len(cands) and score(j + step) > score(j):
            j += step
        if j != i:
            break  # the first direction that improves is the slope; the other side is worse
    _refine(cands, runs, score_at=lambda tg: _score_split(tg, runs, system, model, task, gpus, seed, p),
            machine=p.network.gpus_per_machine, lo=cands[0], hi=cands[-1])
    best = max(runs.values(), key=lambda r: r.throughput)
    logger.debug("%s %s %s %d GPUs: tried %s (start %.0f)", system, model, task, gpus, sorted(runs), here)
    return SearchResult(best, {k: v.throughput for k, v in sorted(runs.items())})
