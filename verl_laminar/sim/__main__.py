"""Command line: ``python -m verl_laminar.sim --paper --json`` or one configuration from flags.

    python -m verl_laminar.sim --paper --json [--out DIR] [--workers N] [--seed S] [--no-plots]
    python -m verl_laminar.sim --model 32b --gpus 128 --system laminar [--trainer-gpus 64] [--task math] [--seed 0]
        [--lengths MEDIAN,P99[,MAX] | --lengths FILE] [--prompt-lengths ...] [--batch N] [--group-size N] [--updates N]
    python -m verl_laminar.sim --sensitivity [--out DIR]
    python -m verl_laminar.sim --validate --json [--results docs/results]   # predicted beside measured (CPU)
    python -m verl_laminar.sim plan --model 32b --gpus 256 [--task math] [--lengths ...] [--seed 0] [--json]

``plan`` (``sim.plan``) gives every system's best split on one cluster and the overrides that run Laminar there.
The workload flags (``sim.lengths``) describe a user's own workload; without them it is the paper's.

Results are JSON on stdout (``--json``) or a short table; plots and the full JSON go under ``--out``
(default ``runs/sim/``, git-ignored). Every number printed is SIMULATED. Every JSON opens with the provenance
record (``bench.provenance``: date, machine, command, commit, load average at start); ``--results docs/results``
also writes the full JSON (provenance, parameters, summary, rows) to ``docs/results/sim_paper_<date>.json``
(``sim_sensitivity_<date>.json``, or ``sim_<model>_<gpus>gpus_<system>_<date>.json`` for one configuration).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Optional

from verl_laminar.bench.provenance import claim_result_path, provenance
from verl_laminar.sim.grid import repack_reference, run_grid, summarize
from verl_laminar.sim.lengths import LengthsError, add_workload_arguments, params_from_args, spec_from_args
from verl_laminar.sim.params import DEFAULT_PARAMS, MODELS
from verl_laminar.sim.search import best_split
from verl_laminar.sim.systems import SYSTEMS

logger = logging.getLogger("verl_laminar.sim")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m verl_laminar.sim", description=__doc__.split("\n")[0],
                                 epilog="subcommands: plan (every system's best split on one cluster and the "
                                        "overrides that run Laminar there; python -m verl_laminar.sim plan --help)")
    ap.add_argument("--paper", action="store_true", help="run the paper's grid (models x GPUs x tasks, all systems)")
    ap.add_argument("--sensitivity", action="store_true", help="sweep the parameters that matter on a few cells")
    ap.add_argument("--validate", action="store_true",
                    help="predict our CPU benchmarks from the cpu profile (sim.validate) beside their measured values")
    ap.add_argument("--validate-seeds", type=int, default=16, help="--validate: workload draws averaged per mode")
    ap.add_argument("--results-in", default=None, metavar="DIR",
                    help="--validate: where the measured files are (default: the repository's docs/results)")
    ap.add_argument("--json", action="store_true", help="print JSON to stdout")
    ap.add_argument("--model", choices=sorted(MODELS), help="single configuration: model")
    ap.add_argument("--gpus", type=int, help="single configuration: total GPUs")
    ap.add_argument("--system", choices=sorted(SYSTEMS), help="single configuration: system")
    ap.add_argument("--task", default="math", choices=["math", "tool"])
    ap.add_argument("--trainer-gpus", type=int, default=None, help="fix the split instead of searching it")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--out", default=os.path.join("runs", "sim"), help="directory for plots and full JSON")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--results", default=None, metavar="DIR",
                    help="also write the full JSON to DIR/<results-name>_<date>.json (the README cites docs/results)")
    ap.add_argument("--results-name", default=None,
                    help="file name stem for --results (default: sim_paper, sim_sensitivity or "
                         "sim_<model>_<gpus>gpus_<system>)")
    ap.add_argument("-v", "--verbose", action="store_true")
    add_workload_arguments(ap)
    return ap


def _clean(x):
    """JSON has no NaN: write null."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x


def _emit(obj: dict, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps(_clean(obj), indent=1, sort_keys=False) + "\n")
        return
    for k, v in obj.items():
        sys.stdout.write(f"{k}: {v}\n")


def _results_file(args: argparse.Namespace, prov: dict) -> Optional[Path]:
    if not args.results:
        return None
    stem = args.results_name or ("sim_paper" if args.paper else "sim_sensitivity" if args.sensitivity
                                 else "sim_validate" if args.validate
                                 else f"sim_{args.model}_{args.gpus}gpus_{args.system}")
    try:
        return claim_result_path(args.results, stem, prov)
    except FileExistsError as e:
        _parser().error(str(e))


def _save(path: Optional[Path], record: dict) -> None:
    if path is not None:
        path.write_text(json.dumps(_clean(record), indent=1) + "\n")
        logger.info("wrote %s", path)


# Subcommands: the first argument names one, the rest of the command line is its own (each parses its flags).
SUBCOMMANDS = {"plan": "verl_laminar.sim.plan"}


def _subcommand(argv: list) -> Optional[int]:
    if not argv or argv[0] not in SUBCOMMANDS:
        return None
    import importlib

    return importlib.import_module(SUBCOMMANDS[argv[0]]).main(argv[1:])


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    sub = _subcommand(argv)
    if sub is not None:
        return sub
    ap = _parser()
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(message)s")
    if not (args.paper or args.sensitivity or args.validate or (args.model and args.gpus and args.system)):
        ap.error("give --paper, --sensitivity, --validate, or all of --model, --gpus and --system")
    spec = spec_from_args(args)
    if (args.paper or args.sensitivity) and not spec.is_default():
        # the grid and the sweep are the comparison with the paper: they run the paper's workload
        ap.error("--lengths, --prompt-lengths, --batch, --group-size and --updates apply to one configuration "
                 "(--model/--gpus/--system) and to plan, not to --paper or --sensitivity")
    try:
        p = params_from_args(args, DEFAULT_PARAMS)
    except LengthsError as e:
        ap.error(str(e))
    # simulated, so the machine only decides the runtime; recorded all the same, with the code and the command
    prov = {**provenance(argv, "verl_laminar.sim"), "label": "SIMULATED"}
    saved = _results_file(args, prov)
    out = Path(args.out)
    if args.validate:
        from verl_laminar.sim.validate import RESULTS, validate

        try:
            res = {**prov, **validate(Path(args.results_in) if args.results_in else RESULTS,
                                      range(args.seed, args.seed + args.validate_seeds))}
        except FileNotFoundError as e:
            ap.error(str(e))
        _save(saved, res)
        _emit(res, args.json)
        return 0 if res["all_within"] else 1
    params = dataclasses.asdict(p)
    if args.paper:
        rows, secs = run_grid(args.seed, p, workers=args.workers)
        summary = summarize(rows)
        summary["repack_reference_32b_128gpus"] = repack_reference(args.seed, p)
        summary["grid_runtime_s"] = round(secs, 1)
        summary["workers"] = args.workers
        summary["seed"] = args.seed
        out.mkdir(parents=True, exist_ok=True)
        record = {**prov, "params": params, "summary": summary, "rows": rows}
        (out / "paper.json").write_text(json.dumps(_clean(record), indent=1))
        _save(saved, record)
        if not args.no_plots:
            from verl_laminar.sim.plots import write_all

            summary["plots"] = write_all(rows, summary, out, args.seed, p)
        _emit({**prov, **summary}, args.json)
        return 0
    if args.sensitivity:
        from verl_laminar.sim.sensitivity import sweep

        out.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        res = {**prov, "params": params, **sweep(args.seed, p, workers=args.workers)}
        res["runtime_s"] = round(time.perf_counter() - t0, 1)
        (out / "sensitivity.json").write_text(json.dumps(_clean(res), indent=1))
        _save(saved, res)
        _emit(res, args.json)
        return 0
    t0 = time.perf_counter()
    sr = best_split(args.system, args.model, args.task, args.gpus, args.seed, p, args.trainer_gpus)
    res = {**prov, **sr.best.as_dict()}
    if not spec.is_default():
        res["workload"] = spec.describe()
    res["splits_tried"] = {str(k): round(v, 1) for k, v in sr.tried.items()}
    res["runtime_s"] = round(time.perf_counter() - t0, 2)
    _save(saved, {**res, "params": params})
    _emit(res, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
