"""The simulated systems, by name. ``simulate`` runs one configuration and returns its ``Result``."""

from __future__ import annotations

from typing import Callable

from verl_laminar.sim.engine import paused_gc
from verl_laminar.sim.systems.areal import AReaL, ArealMechanics
from verl_laminar.sim.systems.base import Layout, Result, Setup, default_layout
from verl_laminar.sim.systems.laminar import Laminar
from verl_laminar.sim.systems.one_step_off import OneStepOff
from verl_laminar.sim.systems.separate_async import SeparateAsync
from verl_laminar.sim.systems.synchronous import Pipelined, Sync

SYSTEMS: dict[str, Callable[[Setup], object]] = {
    "sync": Sync,
    "sync_bypass": lambda s: Sync(s, bypass=True),  # verl's rollout_correction.bypass_mode: no old-log-prob pass
    # verl's separate_async as its code runs: continuous generation, aborted and resumed at every sync
    "separate_async": SeparateAsync,
    "one_step_off": OneStepOff,  # a strict one-step-off schedule as events (a barrier every step)
    "one_step": lambda s: Pipelined(s, streaming=False),
    "streaming": lambda s: Pipelined(s, streaming=True),
    "areal": AReaL,
    "laminar": lambda s: Laminar(s, repack=True, relays=True),
    "laminar_norepack": lambda s: Laminar(s, repack=False, relays=True),
    "laminar_norelay": lambda s: Laminar(s, repack=True, relays=False),
}
# AReaL with one of its mechanisms changed (docs/sim_areal.md): each name says what differs from ``areal``.
AREAL_ABLATIONS: dict[str, dict] = {
    "areal_full_weights": {"full_weight_broadcast": True},  # AReaL's own wiring: rank 0 sends all W to every GPU
    "areal_ofp0": {"staleness_bound": 0},  # the dataclass default of max_head_offpolicyness
    "areal_unbounded": {"staleness_bound": None},
    "areal_seq_slots": {"group_slots": False},  # a finished sample frees its slot at once
    "areal_no_cap": {"max_concurrent_batches": None},  # only the staleness gate limits submission
    "areal_least_loaded": {"round_robin": False},
    "areal_no_global_pause": {"pause_all_during_update": False},
    "areal_keep_cache": {"flush_prefix_cache": False},
    "areal_no_poll": {"resume_poll_s": 0.0},
    "areal_no_gather": {"fsdp_gather": False},
    "areal_prox_logp": {"prox_logp_pass": True},  # the decoupled loss's forward pass, as AReaL's examples set
    # the four update costs above at once: what an update costs AReaL beyond the broadcast itself
    "areal_free_updates": {"pause_all_during_update": False, "flush_prefix_cache": False, "resume_poll_s": 0.0,
                           "fsdp_gather": False},
}
for _name, _kw in AREAL_ABLATIONS.items():
    SYSTEMS[_name] = lambda s, _n=_name, _m=ArealMechanics(**_kw): AReaL(s, _m, name=_n)

BASELINES = ("sync", "one_step", "streaming", "areal")
COLOCATED = frozenset({"sync", "sync_bypass"})


def simulate(system: str, setup: Setup) -> Result:
    if system not in SYSTEMS:
        raise ValueError(f"unknown system {system!r}; choose one of {sorted(SYSTEMS)}")
    with paused_gc():
        res = SYSTEMS[system](setup).run()
    res.system = system
    return res


__all__ = ["SYSTEMS", "AREAL_ABLATIONS", "BASELINES", "COLOCATED", "Layout", "Result", "Setup", "default_layout",
           "simulate"]
