"""``python -m verl_laminar.preflight [options] <the recipe's hydra overrides>``: find what would break a run.

Composes the config exactly as ``python -m verl.trainer.main_ppo`` would (verl's config directory, the same
overrides, ``+laminar=enabled`` included), runs every check of :mod:`verl_laminar.preflight.checks` and prints one
table (``--json``: the table as JSON). Exit status 1 when any check would fail, 2 on a usage error.

Every recipe script runs this on its own overrides instead of training when ``LAMINAR_PREFLIGHT=1`` is set.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import os
import sys
from typing import Optional

from verl_laminar.preflight.checks import FAIL, OK, WARN, Options, Report, Row, run_checks
from verl_laminar.preflight.gpu_stack import check_gpu_stack

logger = logging.getLogger("verl_laminar.preflight")


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    # main_ppo is @hydra.main(config_path="config", config_name="ppo_trainer") in verl/trainer
    verl_dir = list(importlib.util.find_spec("verl").submodule_search_locations)[0]
    with initialize_config_dir(config_dir=os.path.join(verl_dir, "trainer", "config"), version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=overrides)


def platform_row(report: Report, cfg, target: str = "auto") -> bool:
    """Which platform the job's processes will use and why; returns whether the rows evaluate a CPU job.

    ``target``: what the recipe is for. ``gpu`` (the cluster recipes): a CPU decision forced by the environment or
    by a cluster without accelerators fails; on a host with neither an accelerator nor a cluster to ask (a laptop,
    CI) the recipe is checked as for its GPU cluster. ``cpu``: the CPU platform is expected. ``auto``: whatever
    this process would decide.
    """
    from verl_laminar.platform.cpu import this_process_decision

    d = this_process_decision()
    report.facts["platform"] = {"cpu": d.cpu, "source": d.source, "reason": d.reason, "target": target}
    value = f"{'cpu' if d.cpu else 'accelerator'} ({d.source}: {d.reason})"
    if target == "gpu" and d.cpu and d.source != "host":
        report.add("platform", FAIL, value, "a GPU recipe would run as a CPU job (its config rewritten for CPU): "
                   "unset LAMINAR_CPU_PLATFORM / VERL_PLATFORM or set LAMINAR_CPU_PLATFORM=0, and point RAY_ADDRESS "
                   "at a cluster whose nodes have GPUs")
        return True
    if target == "gpu" and d.cpu:
        report.add("platform", WARN, value, "no accelerator and no Ray cluster here: checked as for the GPU cluster "
                   "the recipe names; start the job where Ray reaches GPU nodes (RAY_ADDRESS)")
        return False
    if target == "cpu" and not d.cpu:
        report.add("platform", WARN, value, "a CPU recipe on accelerators: it runs on them (LAMINAR_CPU_PLATFORM=1 "
                   "forces the CPU platform)")
        return False
    report.add("platform", OK, value)
    return d.cpu


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m verl_laminar.preflight", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    p.add_argument("--target", choices=("auto", "gpu", "cpu"), default="auto",
                   help="what the recipe is for (gpu: check as for its cluster even from a host without one)")
    p.add_argument("--link-gbps", type=float, default=None,
                   help="bandwidth of one relay hop in Gbit/s (default: laminar.relay.link_gbps)")
    p.add_argument("--gpu-memory-gib", type=float, default=80.0, help="memory of one rollout GPU (default 80)")
    p.add_argument("--node-role", choices=("auto", "rollout", "master", "trainer", "none"), default="auto",
                   help="relay role of this node for the /dev/shm check (auto: rollout where an accelerator is seen)")
    p.add_argument("--model-config", default=None, help="config.json of a model that is neither local nor shipped")
    p.add_argument("--no-construct", action="store_true", help="skip constructing verl's trainer class")
    p.add_argument("overrides", nargs="*", help="hydra overrides, as given to verl.trainer.main_ppo")
    return p


def main(argv: Optional[list[str]] = None) -> int:
    args, rest = _parser().parse_known_args(argv)
    overrides = list(args.overrides) + [a for a in rest if a != "--"]
    unknown = [a for a in overrides if a.startswith("--")]
    if unknown:
        logger.error("unknown options %s (hydra overrides look like key=value)", unknown)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    opts = Options(target=args.target, link_gbps=args.link_gbps, gpu_memory_gib=args.gpu_memory_gib,
                   node_role=args.node_role,
                   model_config=args.model_config, construct_trainer=not args.no_construct)
    with contextlib.redirect_stdout(sys.stderr):  # verl's checks print; stdout carries the table (or JSON) only
        report = preflight(overrides, opts)
    sys.stdout.write((json.dumps(report.to_json(), indent=2) if args.json else report.table()) + "\n")
    return 1 if report.failed else 0


def preflight(overrides: list[str], opts: Optional[Options] = None) -> Report:
    try:
        cfg = compose(overrides)
    except Exception as e:  # noqa: BLE001 - a composition error is the first row, and the only one
        report = Report()
        report.add("config.compose", FAIL, type(e).__name__, str(e).strip().splitlines()[0])
        return report
    opts = opts or Options()
    cpu = {"job": False}

    def platform(r: Report, c) -> bool:
        cpu["job"] = platform_row(r, c, opts.target)
        return cpu["job"]

    report = run_checks(cfg, opts, platform=platform)
    check_gpu_stack(report, cfg, cpu_job=cpu["job"])  # the host's facts: kept out of the start-time checks
    report.rows.insert(0, Row("config.compose", OK, f"{len(overrides)} overrides composed"))
    return report


if __name__ == "__main__":
    sys.exit(main())
