"""The simulated systems, by name. ``simulate`` runs one configuration and returns its ``Result``."""

from __future__ import annotations

from typing import Callable

from verl_laminar.sim.engine import paused_gc
from verl_laminar.sim.systems.areal import AReaL
from verl_laminar.sim.systems.base import Layout, Result, Setup, default_layout
from verl_laminar.sim.systems.laminar import Laminar
from verl_laminar.sim.systems.synchronous import Pipelined, Sync

SYSTEMS: dict[str, Callable[[Setup], object]] = {
    "sync": Sync,
    "one_step": lambda s: Pipelined(s, streaming=False),
    "streaming": lambda s: Pipelined(s, streaming=True),
    "areal": AReaL,
    "laminar": lambda s: Laminar(s, repack=True, relays=True),
    "laminar_norepack": lambda s: Laminar(s, repack=False, relays=True),
    "laminar_norelay": lambda s: Laminar(s, repack=True, relays=False),
}
BASELINES = ("sync", "one_step", "streaming", "areal")
COLOCATED = frozenset({"sync"})


def simulate(system: str, setup: Setup) -> Result:
    if system not in SYSTEMS:
        raise ValueError(f"unknown system {system!r}; choose one of {sorted(SYSTEMS)}")
    with paused_gc():
        res = SYSTEMS[system](setup).run()
    res.system = system
    return res


__all__ = ["SYSTEMS", "BASELINES", "COLOCATED", "Layout", "Result", "Setup", "default_layout", "simulate"]
