"""One part of the grid: one seed, every mode back to back on this machine, each under the same wall-clock
budget, then its held-out evaluations off the clock (process glue; the policy is in plan, clock, prompts and
summary).

    targets (once, before any run): the warm start's held-out greedy accuracy and sampled dev reward
    per mode: stage data -> launch.launch (recipe, budget, pruning) -> the versions at the marks ->
        heldout.py on those checkpoints (a process of its own) -> delete the checkpoints -> the reward record
    per part: verl's dispatch order for the seed -> prompts.common_fingerprints -> summary.run_summary per mode
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from verl_laminar.bench.learn import clock, plan, prompts, summary
from verl_laminar.bench.learn.launch import Outcome, launch, prune, published
from verl_laminar.bench.learn.task import Task, stage

logger = logging.getLogger("verl_laminar.bench.learn")


@dataclass(frozen=True)
class LearnConfig:
    modes: tuple[str, ...]
    budget_s: float
    n_marks: int
    workload: plan.Workload
    task: Task
    model: Path
    fixture: Optional[str]
    out: Path
    heldout_rows: int = 128
    dev_rows: int = 64
    reward_margin: float = 0.2
    heldout_margin: float = 0.25
    window: int = 5
    startup_s: float = 900.0
    keep_checkpoints: bool = False
    smoke: bool = False
    sync_ranks: int = 2
    trainer_ranks: int = 1
    replicas: int = 2
    python: str = field(default=sys.executable)

    @property
    def marks(self) -> list[float]:
        return plan.marks(self.budget_s, self.n_marks)

    def placement(self, mode: str) -> plan.Placement:
        return plan.placement(mode, self.sync_ranks, self.trainer_ranks, self.replicas)


def evaluate(cfg: LearnConfig, models: list[Path], rows: Path, max_rows: int, out_json: Path,
             sample: int = 0, seed: int = 0) -> dict[str, dict]:
    """heldout.py in a process of its own; {model path: result}."""
    if not models:
        return {}
    cmd = [cfg.python, "-m", "verl_laminar.bench.learn.heldout", "--tokenizer", str(cfg.model), "--rows", str(rows),
           "--max-rows", str(max_rows), "--max-new-tokens", str(cfg.workload.resp), "--out", str(out_json),
           *(["--sample", str(sample), "--seed", str(seed)] if sample else []), *map(str, models)]
    out_json.parent.mkdir(parents=True, exist_ok=True)
    log = out_json.with_suffix(".log")
    with open(log, "w") as f:
        done = subprocess.run(cmd, cwd=plan.REPO, stdout=f, stderr=subprocess.STDOUT)
    if done.returncode != 0 or not out_json.is_file():
        raise RuntimeError(f"evaluation failed (exit {done.returncode}); see {log}")
    return json.loads(out_json.read_text())


def base_values(cfg: LearnConfig) -> dict:
    """The warm start's held-out greedy accuracy and dev reward (sampled as training samples): the targets'
    starting points and every mode's held-out value at t = 0."""
    folder = cfg.out / "base"
    held = evaluate(cfg, [cfg.model], cfg.task.heldout, cfg.heldout_rows, folder / "heldout.json")[str(cfg.model)]
    dev = evaluate(cfg, [cfg.model], cfg.task.dev, cfg.dev_rows, folder / "dev.json", sample=cfg.workload.group,
                   seed=0)[str(cfg.model)]
    return {"heldout_accuracy": held["accuracy"], "dev_reward": dev["mean_score"], "heldout": held, "dev": dev}


@dataclass
class ModeRun:
    mode: str
    outcome: Outcome
    heldout: list[dict]
    prompt_ids: list[str]
    clock_check: Optional[dict] = None
    response_length: Optional[dict] = None


def run_mode(cfg: LearnConfig, mode: str, seed: int, base_heldout: float) -> ModeRun:
    part = cfg.out / f"seed{seed}"
    paths = plan.RunPaths(out=part / mode, data=stage(cfg.task, cfg.out / "data"))
    if paths.out.exists():
        shutil.rmtree(paths.out)  # verl resumes from a checkpoint it finds there
    paths.out.mkdir(parents=True)
    cmd, env = plan.mode_command(mode, cfg.workload, paths, str(cfg.model), seed, cfg.python, cfg.placement(mode))
    outcome = launch(mode, cmd, env, part / f"{mode}.log", paths.tracker, cfg.budget_s, cfg.startup_s, cfg.marks,
                     paths.checkpoints)
    pub = published(outcome.record, cfg.budget_s)
    versions = plan.versions_at_marks(cfg.marks, pub)
    keep = plan.keep_after_run(cfg.marks, pub)
    prune(paths.checkpoints, keep, max(outcome.record.steps, default=0))
    missing = sorted(v for v in keep if not paths.checkpoint(v).is_dir())
    if missing:
        logger.error("%s seed %d: no saved model for versions %s (at %s)", mode, seed, missing, paths.checkpoints)
    found = {v: paths.checkpoint(v) for v in sorted(keep) if v not in missing}
    try:
        evals = evaluate(cfg, list(found.values()), cfg.task.heldout, cfg.heldout_rows,
                         part / f"{mode}.heldout.json")
    except RuntimeError as e:  # the run's curves are still worth keeping; its held-out points stay empty
        logger.error("%s seed %d: %s", mode, seed, e)
        evals = {}
    acc = {v: evals[str(p)] for v, p in found.items() if str(p) in evals}
    base = {"accuracy": base_heldout, "n": cfg.heldout_rows or None}
    points = [{"mark_s": 0.0, "version": 0, **base}]
    for m, v in versions.items():
        got = acc.get(v) if v else base
        points.append({"mark_s": m, "version": v, "accuracy": got.get("accuracy") if got else None,
                       "n": got.get("n") if got else None})
    if not cfg.keep_checkpoints:
        _drop_checkpoints(paths)
    timeline = paths.checkpoints / "laminar_timeline.jsonl"
    return ModeRun(mode, outcome, points, scored_within(outcome, paths.record, cfg.budget_s),
                   clock_check(outcome, timeline), response_lengths(timeline))


def clock_check(outcome: Outcome, timeline: Path) -> Optional[dict]:
    """For a Laminar run, the clock's start against a measured event: the first trajectory's start in its
    timeline (the router's dispatch to a replica), both in seconds after the launch."""
    from verl_laminar import timeline as tl

    t0 = clock.start_s(outcome.record.steps, outcome.record.seen_s)
    if t0 is None or not timeline.is_file():
        return None
    starts = [r.start for r in tl.read_timeline(timeline) if isinstance(r, tl.TrajectorySpan)]
    if not starts:
        return None
    first = min(starts) - outcome.launch_unix
    return {"estimated_first_dispatch_s": round(t0, 3), "timeline_first_trajectory_start_s": round(first, 3),
            "difference_s": round(t0 - first, 3)}


def response_lengths(timeline: Path) -> Optional[dict]:
    """For a Laminar run, response lengths of what it generated (finished trajectories) against what it trained
    (the step records): a bound that admitted or kept trajectories by length would show as a trained p99 below the
    generated one. None without a timeline; ``trained`` None for a timeline whose steps do not record lengths."""
    from verl_laminar import timeline as tl
    from verl_laminar.bench.pool_load import percentile

    if not timeline.is_file():
        return None
    recs = tl.read_timeline(timeline)
    generated = [r.response_tokens for r in recs if isinstance(r, tl.TrajectorySpan)]
    trained = [n for r in recs if isinstance(r, tl.Step) for n in r.response_tokens]
    if not generated:
        return None
    out = {"generated": len(generated), "generated_p50": percentile(generated, 0.5),
           "generated_p99": percentile(generated, 0.99), "generated_max": max(generated), "trained": len(trained),
           "trained_p50": percentile(trained, 0.5), "trained_p99": percentile(trained, 0.99),
           "trained_max": max(trained, default=None)}
    out["trained_over_generated_p99"] = (round(out["trained_p99"] / out["generated_p99"], 4)
                                         if trained and out["generated_p99"] else None)
    return out


def _drop_checkpoints(paths: plan.RunPaths) -> None:
    for entry in paths.checkpoints.glob("global_step_*"):
        shutil.rmtree(entry, ignore_errors=True)


def scored_within(outcome: Outcome, record: Path, budget_s: float) -> list[str]:
    """The prompt ids the run scored before its clock reached the budget, in the order they were scored."""
    end = clock.deadline_s(outcome.record.steps, outcome.record.seen_s, budget_s, grace_s=0.0)
    lines = prompts.read_record(record)
    if end is not None:
        lines = [r for r in lines if r.get("t", 0) <= outcome.launch_unix + end]
    return [str(r.get("i")) for r in lines]


class OrderCache:
    """The training set's prompt ids after verl's filter (slow: tokenises every prompt), computed once."""

    def __init__(self, cfg: LearnConfig) -> None:
        self.cfg = cfg
        self._ids: Optional[list[str]] = None

    def order(self, seed: int, occurrences: int) -> list[str]:
        if self._ids is None:
            self._ids = prompts.filtered_ids(self.cfg.task.train, self.cfg.model, self.cfg.workload.prompt)
        return prompts.dispatch_order(self._ids, seed, self.cfg.workload.batch, occurrences)


def run_part(cfg: LearnConfig, seed: int, targets: plan.Targets, base: dict, orders: OrderCache
             ) -> tuple[dict[str, dict], dict, float]:
    """Every mode for one seed: (mode -> run summary, the seed's prompt-order entry, wall seconds)."""
    t = time.monotonic()
    done = {mode: run_mode(cfg, mode, seed, base["heldout_accuracy"]) for mode in cfg.modes}
    most = max((len(r.prompt_ids) for r in done.values()), default=0) // cfg.workload.group
    order = orders.order(seed, most + 4 * cfg.workload.batch)
    fp = prompts.common_fingerprints({m: r.prompt_ids for m, r in done.items()}, order, cfg.workload.group)
    per_step = cfg.workload.batch * cfg.workload.group
    runs = {}
    for mode, r in done.items():
        rec = r.outcome.record
        runs[mode] = summary.run_summary(seed, rec.steps, rec.seen_s, cfg.budget_s, cfg.window, per_step,
                                         {"reward": targets.reward, "heldout": targets.heldout}, r.heldout,
                                         r.outcome.ended_by, rec.exit_code, fp["modes"][mode])
        runs[mode]["prompts"]["trained_groups"] = runs[mode]["steps"] * cfg.workload.batch
        runs[mode]["launch_wall_s"] = round(r.outcome.wall_s, 1)
        runs[mode]["clock_check"] = r.clock_check
        runs[mode]["response_length"] = r.response_length
    entry = {"common_prefix": fp["common_prefix"], "equal": fp["equal"],
             "first_ids": order[:min(fp["common_prefix"], 16)]}
    return runs, entry, time.monotonic() - t
