"""``python -m verl_laminar.bench.learn``: time to reward of verl's trainers and Laminar, one JSON and its pictures.

    python -m verl_laminar.bench.learn --seeds 1 --results docs/results        # one part: seed 0, every mode
    python -m verl_laminar.bench.learn --add-to docs/results/learn_<date>.json --seed-list 1   # one more part
    python -m verl_laminar.bench.learn --smoke --out /tmp/learn-smoke          # CI: sync and laminar, a minute each
    python -m verl_laminar.bench.learn --modes laminar,laminar_bounded --seed-list 2 --results docs/results \
        --results-name learn_rerun --targets-from docs/results/learn_<date>.json   # a rerun of some modes

How to read the result and the rules behind it: docs/learn.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Optional

from verl_laminar.bench.learn import plan, plots, result, run, summary
from verl_laminar.bench.learn.task import TaskError, find_model, find_task, model_identity
from verl_laminar.bench.provenance import claim_result_path, provenance

logger = logging.getLogger("verl_laminar.bench.learn")
MODULE = "verl_laminar.bench.learn"
REPO = plan.REPO
# --smoke: the same code path, small: the values of the options it leaves unset
SMOKE = {"modes": ",".join(plan.SMOKE_MODES), "seeds": 1, "budget_s": 60.0, "marks": 2, "heldout_rows": 16,
         "dev_rows": 8}
DEFAULTS = {"modes": ",".join(plan.MODES), "seeds": 3, "budget_s": 600.0, "marks": 6, "heldout_rows": 128,
            "dev_rows": 32}


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default=None, help=f"comma-separated, run in this order (default all: {DEFAULTS['modes']})")
    ap.add_argument("--seeds", type=int, default=None, help="how many seeds (parts), from 0 or after the --add-to "
                    "file's (default 3; a part is one seed with every mode)")
    ap.add_argument("--seed-list", default=None, help="comma-separated seeds instead of --seeds")
    ap.add_argument("--budget-s", type=float, default=None, help="wall-clock seconds per run on the benchmark's clock "
                    "(default 600: four modes and their start-ups fit a part in about an hour)")
    ap.add_argument("--marks", type=int, default=None, help="wall-clock marks for the held-out evaluation (default 6)")
    ap.add_argument("--heldout-rows", type=int, default=None, help="held-out rows evaluated (default 128; 0: all)")
    ap.add_argument("--dev-rows", type=int, default=None, help="dev rows for the reward target (default 32)")
    ap.add_argument("--reward-margin", type=float, default=0.2, help="reward target = warm start's dev reward + this")
    ap.add_argument("--heldout-margin", type=float, default=0.25,
                    help="held-out target = warm start's held-out accuracy + this")
    ap.add_argument("--window", type=int, default=5, help="steps in the reward's trailing mean for the reward target")
    for key, default, about in (("batch", 8, "prompts per step"), ("group", 4, "responses per prompt"),
                                ("resp", 512, "max response tokens"), ("prompt", 256, "max prompt tokens"),
                                ("micro", 4, "micro-batch per rank")):
        ap.add_argument(f"--{key}", type=int, default=default, help=f"{about} (default {default})")
    ap.add_argument("--lr", type=float, default=1e-4, help="actor learning rate (default 1e-4, the recipes')")
    ap.add_argument("--data", default=None, help="task folder (train/dev/heldout parquet; default the chain-sum task)")
    ap.add_argument("--model", default=None, help="model folder (default the tiny-chain fixture)")
    ap.add_argument("--startup-s", type=float, default=900.0, help="end a run whose first step has not arrived by then")
    ap.add_argument("--keep-checkpoints", action="store_true", help="keep the marks' checkpoints after evaluation")
    ap.add_argument("--add-to", default=None, metavar="RESULT.json", help="add seeds to this result (refused when its "
                    "task, model, workload, budget, marks or modes differ)")
    ap.add_argument("--targets-from", default=None, metavar="RESULT.json", help="take the targets from this result "
                    "instead of evaluating the warm start (refused when its task, model, workload, budget or marks "
                    "differ; the modes may be a subset): a rerun of some modes, comparable with it")
    ap.add_argument("--out", default=str(REPO / "runs" / "learn"), help="run folder (logs, checkpoints, result.json)")
    ap.add_argument("--results", default=None, help="also write <results>/<results-name>_<date>.json and its pictures")
    ap.add_argument("--results-name", default="learn", help="file name stem under --results (default learn)")
    ap.add_argument("--json", action="store_true", help="print the result JSON on stdout")
    ap.add_argument("--smoke", action="store_true", help="1 seed, sync and laminar, a short budget: the same code path")
    args = ap.parse_args(argv)
    base = SMOKE if args.smoke else DEFAULTS
    for key, value in base.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.mode_list = [m for m in args.modes.split(",") if m]
    bad = [m for m in args.mode_list if m not in plan.MODES]
    if bad or not args.mode_list:
        ap.error(f"--modes {args.modes!r}: unknown {bad}; choose from {', '.join(plan.MODES)}")
    if args.budget_s <= 0 or args.marks < 1 or args.window < 1 or min(args.batch, args.group, args.resp) < 1:
        ap.error("--budget-s, --marks, --window, --batch, --group and --resp must be positive")
    if args.seed_list is not None:
        try:
            args.seed_values = sorted({int(s) for s in args.seed_list.split(",") if s.strip()})
        except ValueError:
            ap.error(f"--seed-list {args.seed_list!r}: comma-separated integers")
    else:
        args.seed_values = None
    if args.add_to and args.results:
        ap.error("--add-to writes into its file; --results names a new one: pass one of them")
    if args.add_to and args.targets_from:
        ap.error("--add-to takes its file's targets already; --targets-from is for a new result")
    return args


def config(args: argparse.Namespace) -> run.LearnConfig:
    task = find_task(args.data)
    model, fixture = find_model(args.model)
    work = plan.Workload(batch=args.batch, group=args.group, resp=args.resp, prompt=args.prompt, lr=args.lr,
                         micro=args.micro)
    return run.LearnConfig(modes=tuple(args.mode_list), budget_s=args.budget_s, n_marks=args.marks, workload=work,
                           task=task, model=model, fixture=fixture, out=Path(args.out).resolve(),
                           heldout_rows=args.heldout_rows, dev_rows=args.dev_rows, reward_margin=args.reward_margin,
                           heldout_margin=args.heldout_margin, window=args.window, startup_s=args.startup_s,
                           keep_checkpoints=args.keep_checkpoints, smoke=args.smoke)


def identity(cfg: run.LearnConfig) -> dict:
    ident = result.identity(cfg.task.identity(), model_identity(cfg.model, cfg.fixture), cfg.workload.as_dict(),
                            cfg.budget_s, cfg.marks, cfg.heldout_rows, cfg.dev_rows, cfg.modes, cfg.window,
                            {m: cfg.placement(m).as_dict() for m in cfg.modes})
    ident["mode_overrides"] = {m: plan.mode_overrides(m) for m in cfg.modes}
    ident["plumbing"] = result.plumbing_note(plan.PLUMBING_KEYS)
    return ident


def choose_seeds(args: argparse.Namespace, existing: Optional[dict]) -> list[int]:
    taken = result.seeds_in(existing) if existing else []
    if args.seed_values is not None:
        clash = sorted(set(args.seed_values) & set(taken))
        if clash:
            raise TaskError(f"seeds {clash} are already in {args.add_to}")
        return args.seed_values
    start = max(taken) + 1 if taken else 0
    return list(range(start, start + args.seeds))


def smoke_problems(res: dict) -> list[str]:
    """What --smoke checks: curves for every mode, a held-out value from a saved checkpoint, equal fingerprints."""
    problems = summary.shape_problems(res)
    for mode, m in res["modes"].items():
        for r in m["seeds"]:
            if not r["curve"]["step"]:
                problems.append(f"{mode} seed {r['seed']}: no step within the budget ({r['ended_by']})")
            if not any(p["version"] > 0 and p.get("accuracy") is not None for p in r["heldout"]):
                problems.append(f"{mode} seed {r['seed']}: no held-out value from a saved checkpoint")
    for seed, entry in res["prompt_order"]["seeds"].items():
        if not entry["equal"]:
            problems.append(f"seed {seed}: prompt fingerprints differ between modes")
        if entry["common_prefix"] < 1:
            problems.append(f"seed {seed}: no prompt every mode trained in verl's dispatch order")
    return problems


def write(res: dict, out: Path, results_path: Optional[Path]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(res, indent=2))
    pictures = plots.write(res, out, prefix="learn_")
    if results_path is not None:
        res["pictures"] = [f"{results_path.stem}_{p}.png" for p in plots.PICTURES
                           if (out / f"learn_{p}.png").is_file()]
        results_path.write_text(json.dumps(res, indent=2))
        pictures += plots.write(res, results_path.parent, prefix=results_path.stem + "_", source=results_path.name)
    return pictures


def main(argv: Optional[list[str]] = None) -> int:
    from verl_laminar.platform.procs import exit_on_sigterm

    args = parse_args(argv)
    exit_on_sigterm()  # a killed benchmark still ends the recipe run it started
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    try:
        cfg = config(args)
        existing = json.loads(Path(args.add_to).read_text()) if args.add_to else None
        ident = identity(cfg)
        if existing is not None:
            why = result.mismatch(existing, ident)
            if why:
                raise TaskError(f"--add-to {args.add_to}: this run measures something else; " + "; ".join(why))
        source = json.loads(Path(args.targets_from).read_text()) if args.targets_from else None
        if source is not None:
            why = result.mismatch(source, ident, subset_of_modes=True)
            if why:
                raise TaskError(f"--targets-from {args.targets_from}: its targets were fixed for something else; "
                                + "; ".join(why))
        seeds = choose_seeds(args, existing)
        record = provenance(argv, MODULE)
        results_path = Path(args.add_to) if args.add_to else (
            claim_result_path(args.results, args.results_name, record) if args.results else None)
    except (TaskError, OSError, ValueError) as e:  # FileExistsError: a result of that name and date exists
        logger.error("%s", e)
        return 2
    fixed = existing if existing is not None else source
    if fixed is not None:
        targets = plan.targets_from_dict(fixed["targets"])
        base = {"heldout_accuracy": targets.base_heldout_accuracy}
    else:
        base = run.base_values(cfg)
        targets = plan.fix_targets(base["dev_reward"], base["heldout_accuracy"], cfg.reward_margin,
                                   cfg.heldout_margin, cfg.window, cfg.workload.group)
        logger.info("targets: reward %.3f, held-out %.3f (%s)", targets.reward, targets.heldout, base)
    target_dict = {**targets.as_dict(), "base_evaluations": {k: base[k] for k in ("heldout", "dev") if k in base}}
    if source is not None:  # the same values, and where they came from
        target_dict = {**source["targets"], "from_result": Path(args.targets_from).name}
    orders = run.OrderCache(cfg)
    runs: dict[str, list[dict]] = {}
    order: dict[str, dict] = {}
    parts: list[dict] = []
    res: dict = {}
    for i, seed in enumerate(seeds):
        part_record = record if i == 0 else provenance(argv, MODULE)  # each part: the load it started under
        part_runs, entry, wall = run.run_part(cfg, seed, targets, base, orders)
        for mode, r in part_runs.items():
            runs.setdefault(mode, []).append(r)
        order[str(seed)] = entry
        parts.append(result.part_record(seed, part_record, wall))
        res = result.assemble(record, ident, existing["targets"] if existing else target_dict, runs, order, parts,
                              cfg.smoke)
        if existing is not None:
            res = result.merge(existing, res)
        for p in write(res, cfg.out, results_path):
            logger.info("picture: %s", p)
    if args.json:
        print(json.dumps(res, indent=2))
    if args.smoke:
        problems = smoke_problems(res)
        for p in problems:
            logger.error("smoke: %s", p)
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
