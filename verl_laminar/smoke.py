"""First contact with a GPU machine: ``+laminar=enabled`` for a few steps on the fixture model, then a verdict.

``bash scripts/gpu_smoke.sh`` (or ``python -m verl_laminar.smoke``) on one machine with 2 or more GPUs: 1 GPU trains
(FSDP), the others each serve a vLLM replica (TP 1), relays run as on a cluster. The weight bucket is set below the
fixture's largest tensor, so the path that sends an oversized tensor on its own runs at every refresh. Afterwards it
checks, from the run's log and the host:

* the run exited 0 and every step trained;
* every replica loaded a trained version (1 or later) through the relays, never going back a version. Not "the last
  version": a replica refreshes only when its own batch ends, so whether it reaches the version published before
  the last step depends on timing (the CPU failover e2e saw a replica generate step 3's data at version 1); the
  verdict reports the versions each replica reached;
* 0 invariant violations (one weight version per trajectory and per group, nothing trained twice);
* nothing of the run is left in ``/dev/shm`` (relay stores are removed at the end).

It prints the verdict as JSON and exits 1 when a check fails. The preflight runs first, on the same overrides.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from verl_laminar import stepfile
from verl_laminar.report.runlog import RunRecord

logger = logging.getLogger("verl_laminar.smoke")

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "cpu" / "run_laminar_grpo.sh"  # the fixture recipe: its overrides suit any device
SHM_ROOT = Path("/dev/shm/laminar-relay")
LOADED = re.compile(r"laminar: replica (\d+) loaded version (\d+)")
RUN_UNTIL = ("every_replica_refreshed",)


def shm_entries(root: Path = SHM_ROOT) -> set[str]:
    return {p.name for p in root.iterdir()} if root.is_dir() else set()


def plan(gpus: int, steps: int, bucket_mb: float, out: Path, model: Optional[str] = None) -> tuple[list[str], dict]:
    """The command and environment of the smoke run on a machine with ``gpus`` GPUs."""
    if gpus < 2:
        raise ValueError(f"{gpus} GPU(s) visible: the smoke run needs 2 or more (1 trains, the others serve "
                         "rollouts: Laminar's replicas are standalone, never colocated with training)")
    env = {"STEPS": str(steps), "REPLICAS": str(gpus - 1), "SKEW": "1", "RESP": "96", "MICRO": "4",
           "OUT": str(out), "PYTHONUNBUFFERED": "1", "LAMINAR_CPU_PLATFORM": os.environ.get(
               "LAMINAR_CPU_PLATFORM", "0")}
    if model:
        env["MODEL"] = model
    # it runs until each replica's own refresh loaded a trained version (laminar.run_until), ``steps`` at most: how
    # many steps that takes depends on the machine (a replica refreshes only when its own batch ends)
    overrides = [f"actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes={bucket_mb:g}",
                 f"laminar.run_until.events=[{','.join(RUN_UNTIL)}]",
                 "actor_rollout_ref.rollout.gpu_memory_utilization=0.3"]
    return ["bash", str(RECIPE), *overrides], env


def evaluate(log: str, steps: int, replicas: int, exit_code: int, shm_before: set[str],
             shm_after: set[str], run: RunRecord) -> dict:
    """The verdict on a finished run (pure: the log text, the run's steps and two listings of the relay store
    root). ``steps``: the run's cap; a run that ended earlier on its awaited events (laminar.run_until) trained
    every step up to that. ``run``: the steps the run wrote to its step file (``verl_laminar.stepfile``; the log's
    lines give the replicas' loads and the early end, never a metric)."""
    from verl_laminar.policy.until import ended_at

    ended = ended_at(log)
    last = ended if ended is not None and ended <= steps else steps
    loads: dict[int, list[int]] = {}
    for r, v in LOADED.findall(log):
        loads.setdefault(int(r), []).append(int(v))
    newest = {r: max(vs) for r, vs in loads.items()}
    checks = {
        "exit_zero": exit_code == 0,
        "every_step_trained": sorted(run.steps) == list(range(1, last + 1)),
        "every_replica_loaded_trained_weights": (sorted(loads) == list(range(replicas))
                                                 and all(v >= 1 for v in newest.values())),
        "versions_never_go_back": all(vs == sorted(vs) for vs in loads.values()),
        "no_invariant_violation": run.violations == 0 and "InvariantViolation" not in log,
        "dev_shm_empty_after": not (shm_after - shm_before),
    }
    return {"ok": all(checks.values()), "checks": checks, "steps": last, "max_steps": steps, "replicas": replicas,
            "replica_versions": {str(r): vs for r, vs in sorted(loads.items())},
            "newest_version_per_replica": {str(r): v for r, v in sorted(newest.items())},
            "left_in_dev_shm": sorted(shm_after - shm_before), "exit_code": exit_code}


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m verl_laminar.smoke", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8, help="the most steps; the run ends once every replica refreshed")
    p.add_argument("--bucket-mb", type=float, default=16.0,
                   help="weight bucket (MiB); below the fixture's largest tensor (~39 MB in bf16) on purpose")
    p.add_argument("--gpus", type=int, default=None, help="GPUs to use (default: all visible)")
    p.add_argument("--out", type=Path, default=REPO / "runs" / "gpu_smoke")
    p.add_argument("--limit-s", type=float, default=1800.0, help="end the run after this long (it has hung)")
    p.add_argument("--dry-run", action="store_true", help="print the command and environment, run nothing")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    gpus = args.gpus if args.gpus is not None else _gpu_count()
    try:
        cmd, env = plan(gpus, args.steps, args.bucket_mb, args.out)
    except ValueError as e:
        logger.error("%s", e)
        return 2
    if args.dry_run:
        sys.stdout.write(json.dumps({"command": cmd, "env": env}, indent=2) + "\n")
        return 0
    from verl_laminar.watchdog import run_command

    args.out.mkdir(parents=True, exist_ok=True)
    preflight = subprocess.run(cmd, env={**os.environ, **env, "LAMINAR_PREFLIGHT": "1"}, cwd=REPO,
                               capture_output=True, text=True)
    (args.out / "preflight.txt").write_text(preflight.stdout + preflight.stderr)
    if preflight.returncode != 0:
        logger.error("preflight failed (%s):\n%s", args.out / "preflight.txt", preflight.stdout[-4000:])
        return 1
    before = shm_entries()
    log_path = args.out / "run.log"
    t0 = time.monotonic()
    logger.info("smoke run on %d GPUs (%d replicas), log %s", gpus, gpus - 1, log_path)
    with open(log_path, "w") as log:
        code = run_command(cmd, args.limit_s, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env},
                           cwd=REPO)
    steps_file = args.out / "checkpoints" / stepfile.FILE_NAME  # beside the timeline in the recipe's default_local_dir
    # no step file: the run trained no step (the verdict says so)
    run = RunRecord.from_step_file("laminar", steps_file) if steps_file.exists() else RunRecord("laminar")
    verdict = evaluate(log_path.read_text(errors="replace"), args.steps, gpus - 1, code, before, shm_entries(), run)
    verdict.update(wall_s=round(time.monotonic() - t0, 1), gpus=gpus, log=str(log_path))
    sys.stdout.write(json.dumps(verdict, indent=2) + "\n")
    return 0 if verdict["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
