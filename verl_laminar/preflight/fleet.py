"""Preflight row for ``laminar.fleet.detached``: what a fleet that outlives the trainer needs from the config.

The namespace is read from the config, so a missing one fails here, before Ray starts. Whether the cluster came from
``ray start`` is known only once the job joined it: ``fleet.outlive.check_cluster`` checks that when the trainer
sets up, with the same message (``policy.attach.require_outliving_cluster``).
"""

from __future__ import annotations

import os
from typing import Any

from omegaconf import DictConfig, OmegaConf

from verl_laminar.policy.attach import NAMESPACE_FIX, NAMESPACE_KEY, NO_NAMESPACE
from verl_laminar.preflight.report import FAIL, OK, Report


def check_fleet(report: Report, cfg: DictConfig, lam: Any) -> None:
    if not lam.fleet.detached:
        report.add("fleet.detached", OK, "off (the rollouts die with the trainer and restart with the job)")
        return
    namespace = OmegaConf.select(cfg, NAMESPACE_KEY)
    if namespace is None:
        report.add("fleet.detached", FAIL, NO_NAMESPACE, NAMESPACE_FIX)
        return
    address = os.environ.get("RAY_ADDRESS") or OmegaConf.select(cfg, "ray_kwargs.ray_init.address")
    where = f"cluster {address}" if address else "the last `ray start` on this host (checked at set-up)"
    report.add("fleet.detached", OK, f"namespace {namespace!r}, {where}")
