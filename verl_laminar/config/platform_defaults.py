"""The ``laminar.*`` defaults that depend on the hardware the rollouts run on.

``+laminar=enabled`` leaves these keys null; at start-up each takes its platform's value, which is logged and
written back into the run's config. A value the user set is kept. The GPU values are the paper's; the CPU values
are what the CPU platform needs to run without false alarms, so that a recipe (the colocated CPU sync recipe
under ``+laminar=enabled`` included) never has to carry them.

Pure: the caller says whether the run is on the CPU platform.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf, open_dict

from verl_laminar.config.schema import LaminarConfig

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("LAMINAR_LOGGING_LEVEL", "INFO"))  # start-up decisions belong in the run's record


@dataclass(frozen=True)
class PlatformDefault:
    key: str  # laminar.<section>.<name>
    gpu: Any
    cpu: Any
    why: str  # why the two differ

    @property
    def section(self) -> str:
        return self.key.split(".")[1]

    @property
    def name(self) -> str:
        return self.key.split(".")[2]


DEFAULTS: tuple[PlatformDefault, ...] = (
    PlatformDefault("laminar.repack.interval_s", 5.0, 1.0,
                    "the paper's 5 s between repack rounds is sized for minute-long GPU trajectories; on a CPU "
                    "they take seconds, and a 5 s round finds the tail already finished"),
    PlatformDefault("laminar.heartbeat.dead_after_s", 5.0, 30.0,
                    "a decode loop on a few shared CPU cores stalls for seconds while the trainer's update holds "
                    "them (3 s gave false deaths of healthy replicas), so a hung replica is declared after 30 s"),
)


def resolve(lam: LaminarConfig, on_cpu: bool, cfg: Optional[DictConfig] = None) -> LaminarConfig:
    """``lam`` with every null platform key filled in (and written into ``cfg``, the run's record), each logged."""
    platform = "the CPU platform" if on_cpu else "a GPU host"
    for d in DEFAULTS:
        section = getattr(lam, d.section)
        if getattr(section, d.name) is not None:
            continue
        value = d.cpu if on_cpu else d.gpu
        # replace() re-runs the section's checks on the filled value (dead_after_s > interval_s)
        lam = dataclasses.replace(lam, **{d.section: dataclasses.replace(section, **{d.name: value})})
        if cfg is not None:
            with open_dict(cfg):
                OmegaConf.update(cfg, d.key, value, force_add=True)
        logger.info("laminar: %s not set; %r on %s (%s)", d.key, value, platform,
                    d.why if on_cpu else f"GPU default; the CPU platform uses {d.cpu!r}")
    return lam
