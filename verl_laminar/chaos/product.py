"""Chaos on the product: ``python -m verl.trainer.main_ppo ... +laminar=enabled`` (the CPU recipe's toy math, verl's
reward) with seeded faults injected into the running job.

    python -m verl_laminar.chaos --json [--seed S] [--faults replica_kill=3,...] [--results docs/results]

Dataflow:
    plan_faults(counts, seed): the kinds in a seeded order, one every ``--gap-steps`` training steps
    -> laminar.fault_injection.schedule (the trainer's injector, ``trainer.faults``, strikes each after its step
       publishes: replica SIGKILL / SIGSTOP / garbage answers at a replica holding work, the pool's SIGKILL, the
       trainer's SIGKILL after the step's checkpoint)
    -> launch the CPU recipe with trainer.save_freq=1 and trainer.resume_mode=auto; a trainer kill ends the job,
       and the same command runs again, resuming from the checkpoint (as a user would rerun it)
    -> report (``chaos.report``): faults and their recovery times, groups moved / failed and refilled, requests
       continued from the pool or rerun from their prompts, duplicated and mixed-version trajectories, replacements,
       training throughput around each fault, the effective training time ratio.

Tokens generated while the trainer is down: only with ``--fleet`` (``laminar.fleet.detached``: the launches join a
cluster from ``ray start`` and the replicas outlive a killed trainer). Without it verl's ``TaskRunner`` owns the
replicas and they die with it (``docs/fleet_ownership.md``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import time
from pathlib import Path
from typing import Optional

from verl_laminar.bench.launch import run_logged
from verl_laminar.bench.provenance import claim_result_path, provenance
from verl_laminar.chaos.plan import FIRST_STEP, RECIPE, REPO, parse_counts, plan_faults
from verl_laminar.chaos.report import build_report
from verl_laminar.fleet.cluster import local_cluster
from verl_laminar.policy.faults import KINDS, Fault

logger = logging.getLogger("verl_laminar.chaos.product")

# 11 faults: the minimum of 10 (>= 3 replica SIGKILLs, >= 2 trainer SIGKILLs, the pool, a garbage replica)
# and one more, so that one fault that finds no target still leaves 10 struck
DEFAULT_FAULTS = "replica_kill=3,replica_hang=1,replica_garbage=1,pool_kill=4,trainer_kill=2"
# a replacement replica takes ~80 s to start on 2 busy cores, ~7 steps of this workload: faults come further apart
DEFAULT_GAP_STEPS = 8
FLEET_NAMESPACE = "laminar_chaos"


def launch_command(out: Path, model: str, plan: list[Fault], steps: int, extra: list[str]) -> tuple[list, dict]:
    schedule = ";".join(f.label() for f in plan)
    cmd = ["bash", str(RECIPE), f"laminar.fault_injection.schedule='{schedule}'", "trainer.save_freq=1",
           "trainer.resume_mode=auto", *extra]
    env = {"STEPS": str(steps), "REPLICAS": "2", "SKEW": "1", "RESP": "96", "MICRO": "4", "OUT": str(out),
           "MODEL": model, "PY": sys.executable, "PYTHONUNBUFFERED": "1"}
    return cmd, env


def run(args: argparse.Namespace) -> dict:
    from verl_laminar.fixtures import model_dir

    plan = plan_faults(parse_counts(args.faults), args.seed, args.gap_steps)
    steps = (plan[-1].step if plan else FIRST_STEP) + args.gap_steps
    out = Path(args.out)
    model = str(args.model or model_dir(name=args.fixture))
    cmd, env = launch_command(out, model, plan, steps, args.set)
    with contextlib.ExitStack() as stack:
        if args.fleet:  # the replicas outlive a killed trainer: a cluster from ray start, a fixed namespace
            # the trainer rank and the replicas, as logical GPUs (a replacement takes its dead replica's, released)
            env.update(stack.enter_context(local_cluster(gpus=1 + int(env["REPLICAS"]))))
            cmd += ["laminar.fleet.detached=true", f"+ray_kwargs.ray_init.namespace={FLEET_NAMESPACE}"]
        return _launches(args, plan, steps, out, cmd, env)


def _launches(args: argparse.Namespace, plan: list[Fault], steps: int, out: Path, cmd: list, env: dict) -> dict:
    launches = []
    t_start = time.time()
    for i in range(1 + sum(f.kind == "trainer_kill" for f in plan)):
        t0 = time.time()
        rec = run_logged(f"launch{i}", cmd, env, out / f"launch{i}.log", args.timeout_s)
        launches.append({"t0": t0, "record": rec, "log": out / f"launch{i}.log"})
        last = max(rec.steps, default=0)
        logger.info("launch %d: exit %s after %.0f s, last step %d", i, rec.exit_code, time.time() - t0, last)
        if rec.exit_code == 0 or last >= steps:
            break
        if "killing the trainer process" not in (out / f"launch{i}.log").read_text(errors="replace"):
            logger.error("launch %d failed without a trainer kill (exit %s); see %s", i, rec.exit_code,
                         out / f"launch{i}.log")
            break
    report = build_report(plan, steps, launches, t_start, time.time())
    # the recipe by its path in the repository: a result file names no path of the machine it ran on
    argv = [str(RECIPE.relative_to(REPO)) if a == str(RECIPE) else a for a in cmd]
    report["command"] = {"argv": argv, "env": {k: v for k, v in env.items() if k not in ("MODEL", "PY", "OUT")}}
    return report


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m verl_laminar.chaos", description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0, help="orders the faults")
    ap.add_argument("--faults", default=DEFAULT_FAULTS, help=f"KIND=N,...; kinds: {', '.join(KINDS)}")
    ap.add_argument("--gap-steps", type=int, default=DEFAULT_GAP_STEPS, help="training steps between two faults")
    ap.add_argument("--fixture", default="tiny-qwen")
    ap.add_argument("--model", default=None, help="a model directory instead of the fixture")
    ap.add_argument("--out", default=None, help="run directory (default: a fresh temporary one)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra Hydra override")
    ap.add_argument("--timeout-s", type=float, default=3600.0, help="the most one launch may take")
    ap.add_argument("--fleet", action="store_true",
                    help="laminar.fleet.detached: the launches join a ray start cluster and the replicas outlive a "
                         "killed trainer (tokens generated while it is down are measured)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--results", default=None, metavar="DIR", help="write DIR/<results-name>_<date>.json")
    ap.add_argument("--results-name", default=None, help="default chaos_product, or chaos_nodes<N>_seed<S> with "
                    "--nodes")
    from verl_laminar.chaos.nodes import add_args

    add_args(ap)
    args = ap.parse_args(argv)
    if args.results_name is None:
        args.results_name = f"chaos_nodes{args.nodes}_seed{args.seed}" if args.nodes else "chaos_product"
    if args.nodes and args.fleet:
        ap.error("--nodes runs the product's default ownership; --fleet is for the one-machine run")
    try:
        parse_counts(args.faults)
        plan_faults(parse_counts(args.faults), args.seed, args.gap_steps)
    except ValueError as e:
        ap.error(str(e))
    return args


def main(argv: Optional[list[str]] = None) -> int:
    import tempfile

    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    prov = provenance(argv, "verl_laminar.chaos")  # before the run: the load it started under
    path = None
    if args.results:
        try:  # a clash stops the run here, not after an hour
            path = claim_result_path(args.results, args.results_name, prov)
        except FileExistsError as e:
            logger.error("%s", e)
            return 2
    args.out = args.out or tempfile.mkdtemp(prefix="laminar-chaos-")
    if args.nodes:
        import signal

        from verl_laminar.chaos import nodes

        # a stopped run (SIGTERM) unwinds like a failed one: its emulated cluster is taken down on the way out
        signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
        report = {**prov, **nodes.run(args)}
    else:
        report = {**prov, **run(args)}
    text = json.dumps(report, indent=1)
    if path is not None:
        path.write_text(text + "\n")
        logger.info("wrote %s", path)
        if args.nodes:  # the pictures beside it, each fault marked
            from verl_laminar.chaos.node_plots import pictures

            footer = f"{prov.get('date')} | {prov.get('machine', {}).get('cpu_model')} | commit {prov.get('commit')}"
            for png in pictures(Path(args.out) / "run", Path(args.out) / "harness.log", str(path.with_suffix("")),
                                footer):
                logger.info("wrote %s", png)
    if args.json:
        sys.stdout.write(text + "\n")
    ok = report["duplicated"] == 0 and report["mixed_version_steps"] == 0 and report["completed"]
    if args.nodes:  # and each lost machine's replicas replaced on the machine that joined
        ok = ok and report["lost"] == 0 and report["replacement_nodes_joined"] == report["machine_kills"] >= 1
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
