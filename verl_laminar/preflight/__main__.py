"""``python -m verl_laminar.preflight [options] <the recipe's hydra overrides>``: find what would break a run.

Composes the config exactly as ``python -m verl.trainer.main_ppo`` would (verl's config directory, the same
overrides, ``+laminar=enabled`` included), runs every check of :mod:`verl_laminar.preflight.checks` and prints one
table (``--json``: the table as JSON). Exit status 1 when any check would fail, 2 on a usage error.

Every recipe script runs this on its own overrides instead of training when ``LAMINAR_PREFLIGHT=1`` is set.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import sys
from typing import Optional

from verl_laminar.preflight.checks import FAIL, OK, WARN, Options, Report, Row, run_checks

logger = logging.getLogger("verl_laminar.preflight")


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    # main_ppo is @hydra.main(config_path="config", config_name="ppo_trainer") in verl/trainer
    verl_dir = list(importlib.util.find_spec("verl").submodule_search_locations)[0]
    with initialize_config_dir(config_dir=os.path.join(verl_dir, "trainer", "config"), version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=overrides)


def platform_row(report: Report, cfg) -> bool:
    """Which platform the job's processes will use, and whether a GPU recipe would be run as a CPU job."""
    from verl_laminar.platform.cpu import this_process_decision

    d = this_process_decision()
    gpu_recipe = str(cfg.trainer.get("device", "cuda")) != "cpu" and int(cfg.trainer.n_gpus_per_node) > 0
    report.facts["platform"] = {"cpu": d.cpu, "source": d.source, "reason": d.reason}
    value = f"{'cpu' if d.cpu else 'accelerator'} ({d.source}: {d.reason})"
    if d.cpu and d.source != "host":
        report.add("platform", FAIL if gpu_recipe else OK, value,
                   "the job would run as a CPU job and rewrite the config for CPU: unset LAMINAR_CPU_PLATFORM / "
                   "VERL_PLATFORM or set LAMINAR_CPU_PLATFORM=0, and point RAY_ADDRESS at the GPU cluster")
        return True
    if d.cpu:
        # this host has no accelerator and no cluster to ask: checked as the recipe's target, not as a CPU job
        report.add("platform", WARN, value, "checked as for the GPU cluster the recipe names; where the job runs, "
                   "Ray must reach GPU nodes (set RAY_ADDRESS to the cluster before starting it)")
        return False
    report.add("platform", OK, value)
    return False


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m verl_laminar.preflight", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print the table as JSON")
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
    opts = Options(link_gbps=args.link_gbps, gpu_memory_gib=args.gpu_memory_gib, node_role=args.node_role,
                   model_config=args.model_config, construct_trainer=not args.no_construct)
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
    report = run_checks(cfg, opts, platform=platform_row)
    report.rows.insert(0, Row("config.compose", OK, f"{len(overrides)} overrides composed"))
    return report


if __name__ == "__main__":
    sys.exit(main())
