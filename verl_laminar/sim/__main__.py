"""Command line: ``python -m verl_laminar.sim --paper --json`` or one configuration from flags.

    python -m verl_laminar.sim --paper --json [--out DIR] [--workers N] [--seed S] [--no-plots]
    python -m verl_laminar.sim --model 32b --gpus 128 --system laminar [--trainer-gpus 64] [--task math] [--seed 0]
    python -m verl_laminar.sim --sensitivity [--out DIR]

Results are JSON on stdout (``--json``) or a short table; plots and the full JSON go under ``--out``
(default ``runs/sim/``, git-ignored). Every number printed is SIMULATED.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from pathlib import Path

from verl_laminar.sim.grid import repack_reference, run_grid, summarize
from verl_laminar.sim.params import DEFAULT_PARAMS, MODELS
from verl_laminar.sim.search import best_split
from verl_laminar.sim.systems import SYSTEMS

logger = logging.getLogger("verl_laminar.sim")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m verl_laminar.sim", description=__doc__.split("\n")[0])
    ap.add_argument("--paper", action="store_true", help="run the paper's grid (models x GPUs x tasks, all systems)")
    ap.add_argument("--sensitivity", action="store_true", help="sweep the parameters that matter on a few cells")
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
    ap.add_argument("-v", "--verbose", action="store_true")
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


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(message)s")
    out = Path(args.out)
    p = DEFAULT_PARAMS
    if args.paper:
        rows, secs = run_grid(args.seed, p, workers=args.workers)
        summary = summarize(rows)
        summary["repack_reference_32b_128gpus"] = repack_reference(args.seed, p)
        summary["grid_runtime_s"] = round(secs, 1)
        summary["workers"] = args.workers
        summary["seed"] = args.seed
        out.mkdir(parents=True, exist_ok=True)
        (out / "paper.json").write_text(json.dumps(_clean({"summary": summary, "rows": rows}), indent=1))
        if not args.no_plots:
            from verl_laminar.sim.plots import write_all

            summary["plots"] = write_all(rows, summary, out, args.seed, p)
        _emit(summary, args.json)
        return 0
    if args.sensitivity:
        from verl_laminar.sim.sensitivity import sweep

        out.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        res = sweep(args.seed, p, workers=args.workers)
        res["runtime_s"] = round(time.perf_counter() - t0, 1)
        (out / "sensitivity.json").write_text(json.dumps(_clean(res), indent=1))
        _emit(res, args.json)
        return 0
    if not (args.model and args.gpus and args.system):
        _parser().error("give --paper, --sensitivity, or all of --model, --gpus and --system")
    t0 = time.perf_counter()
    sr = best_split(args.system, args.model, args.task, args.gpus, args.seed, p, args.trainer_gpus)
    res = sr.best.as_dict()
    res["splits_tried"] = {str(k): round(v, 1) for k, v in sr.tried.items()}
    res["label"] = "SIMULATED"
    res["runtime_s"] = round(time.perf_counter() - t0, 2)
    _emit(res, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
