"""Sensitivity sweep: which parameters move Laminar's ratios to its baselines.

Each variation changes one shared parameter (never one system's) and re-runs every system on a few
cells at the splits the default parameters chose, so the sweep isolates the parameter from the
split search. Output: per variation, the mean ratio of Laminar to each baseline over the cells and
Laminar's largest staleness.
"""

from __future__ import annotations

import dataclasses as dc
import multiprocessing as mp
from typing import Callable

from verl_laminar.policy.roofline import H200
from verl_laminar.sim.params import P99_OVER_MEDIAN_SIGMA, SimParams
from verl_laminar.sim.search import best_split
from verl_laminar.sim.systems import BASELINES, Setup, default_layout, simulate

CELLS = (("math", "7b", 64), ("math", "32b", 256), ("math", "72b", 1024))
SYSTEMS = ("laminar",) + BASELINES


def _task(p: SimParams, **kw) -> SimParams:
    return dc.replace(p, tasks=tuple(dc.replace(t, **kw) for t in p.tasks))


def _eff(p: SimParams, **kw) -> SimParams:
    return dc.replace(p, inference=dc.replace(p.inference, efficiency=dc.replace(p.inference.efficiency, **kw)))


def _net(p: SimParams, **kw) -> SimParams:
    return dc.replace(p, network=dc.replace(p.network, **kw))


def _train(p: SimParams, **kw) -> SimParams:
    return dc.replace(p, training=dc.replace(p.training, **kw))


def _sched(p: SimParams, **kw) -> SimParams:
    return dc.replace(p, schedule=dc.replace(p.schedule, **kw))


VARIATIONS: dict[str, Callable[[SimParams], SimParams]] = {
    "default": lambda p: p,
    "response_median_x0.5": lambda p: _task(p, response_median=p.tasks[0].response_median / 2),
    "response_median_x2": lambda p: _task(p, response_median=p.tasks[0].response_median * 2),
    "tail_p99_5x_median": lambda p: _task(p, response_sigma=P99_OVER_MEDIAN_SIGMA * 0.699),  # ln 5 / ln 10
    "tail_p99_20x_median": lambda p: _task(p, response_sigma=P99_OVER_MEDIAN_SIGMA * 1.301),  # ln 20 / ln 10
    "trainer_mfu_0.25": lambda p: _train(p, mfu=0.25),
    "trainer_mfu_0.50": lambda p: _train(p, mfu=0.50),
    "no_fsdp_traffic_limit": lambda p: _train(p, fsdp_comm_factor=0.0),
    "decode_slow_kv_reads": lambda p: _eff(p, kv_bandwidth=0.3, seq_overhead_s=60e-6),
    "decode_overhead_5ms": lambda p: _eff(p, step_overhead_s=5e-3),
    "g2g_fixed_0.1s": lambda p: _net(p, g2g_fixed_s=0.1),
    # paper, Step 2: through shared storage one 4 GB shard takes ~8 s to serialize and 10-20 s to move
    "g2g_via_storage_20s": lambda p: _net(p, g2g_fixed_s=20.0),
    # AReaL's and verl's NCCL sync: trainer rank 0 broadcasts the full weights to every rollout GPU
    "g2g_full_weights_rank0": lambda p: _net(p, g2g_full_weights=True),
    "async_buffer_0.5_steps": lambda p: _sched(p, async_buffer_steps=0.5),
    "async_buffer_2_steps": lambda p: _sched(p, async_buffer_steps=2.0),
    "h200": lambda p: dc.replace(p, device=H200),
}


def _splits(args: tuple) -> tuple:
    cell, system, seed, p = args
    task, model, gpus = cell
    return cell, system, best_split(system, model, task, gpus, seed, p).best.trainer_gpus


def _one(args: tuple) -> tuple:
    name, cell, system, tg, seed, p = args
    task, model, gpus = cell
    q = VARIATIONS[name](p)
    lay = default_layout(model, gpus, tg, q, colocated=system == "sync")
    r = simulate(system, Setup(model, task, lay, seed, q))
    return name, cell, system, r.throughput, r.staleness.get("max", 0)


def sweep(seed: int, p: SimParams, workers: int = 2) -> dict:
    ctx = mp.get_context("fork")
    with ctx.Pool(workers) as pool:
        splits = {(c, s): tg for c, s, tg in pool.map(_splits, [(c, s, seed, p) for c in CELLS for s in SYSTEMS])}
        todo = [(n, c, s, splits[(c, s)], seed, p) for n in VARIATIONS for c in CELLS for s in SYSTEMS]
        results = pool.map(_one, todo, chunksize=1)
    tput: dict = {}
    stale: dict = {}
    for name, cell, system, x, st in results:
        tput[(name, cell, system)] = x
        if system == "laminar":
            stale[name] = max(stale.get(name, 0), st)
    out = {}
    for name in VARIATIONS:
        row = {}
        for b in BASELINES:
            ratios = [tput[(name, c, "laminar")] / tput[(name, c, b)] for c in CELLS]
            row[f"laminar_vs_{b}"] = round(sum(ratios) / len(ratios), 3)
        row["laminar_staleness_max"] = stale[name]
        out[name] = row
    base = out["default"]
    for name, row in out.items():
        row["delta_vs_sync"] = round(row["laminar_vs_sync"] / base["laminar_vs_sync"] - 1, 3)
        row["delta_vs_areal"] = round(row["laminar_vs_areal"] / base["laminar_vs_areal"] - 1, 3)
    return {"label": "SIMULATED", "cells": [list(c) for c in CELLS],
            "splits": {f"{c[1]}@{c[2]}:{s}": tg for (c, s), tg in splits.items()}, "variations": out}


__all__ = ["CELLS", "VARIATIONS", "sweep"]
