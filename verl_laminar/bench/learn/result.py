"""The learning benchmark's JSON (pure): one result over parts, each part one seed with every mode, and the
check that a part added with ``--add-to`` measures the same thing (task, model, workload, budget, marks, modes).

Top level: provenance (the first part's: date, machine, command, commit, load), ``benchmark``, ``identity`` (what
a part must share), ``clock``, ``targets``, ``prompt_order`` (per seed: the common prefix and whether the
fingerprints agree), ``modes`` (``summary.mode_summary`` per mode, recomputed from every seed's run), ``parts``
(per part: its seed, provenance and wall time), ``pictures``.
"""

from __future__ import annotations

import copy
from typing import Mapping, Optional, Sequence

from verl_laminar.bench.learn import clock, prompts, summary

IDENTITY_KEYS = ("task", "model", "workload", "budget_s", "marks_s", "heldout_rows", "dev_rows", "modes",
                 "reward_window_steps", "placements")


def identity(task: Mapping, model: Mapping, workload: Mapping, budget_s: float, marks_s: Sequence[float],
             heldout_rows: int, dev_rows: int, modes: Sequence[str], window: int, placements: Mapping) -> dict:
    return {"task": dict(task), "model": dict(model), "workload": dict(workload), "budget_s": budget_s,
            "marks_s": list(marks_s), "heldout_rows": heldout_rows, "dev_rows": dev_rows, "modes": list(modes),
            "reward_window_steps": window, "placements": dict(placements)}


def mismatch(existing: Mapping, ident: Mapping, subset_of_modes: bool = False) -> list[str]:
    """Why a new part cannot join ``existing`` (empty: it can). Machine and date may differ (each part records
    its own); what is measured may not. ``subset_of_modes``: a rerun of some of ``existing``'s modes (its
    targets reused), so the modes may be fewer, and each one's placement must still match."""
    old = existing.get("identity")
    if not isinstance(old, Mapping):
        return ["the existing file has no 'identity': it is not a result of python -m verl_laminar.bench.learn"]
    out = []
    for key in IDENTITY_KEYS:
        mine, theirs = ident.get(key), old.get(key)
        if subset_of_modes and key == "modes":
            extra = sorted(set(mine or []) - set(theirs or []))
            if extra:
                out.append(f"modes: {extra} are not in the existing result's {theirs!r}")
            continue
        if subset_of_modes and key == "placements":
            theirs = {m: p for m, p in (theirs or {}).items() if m in (mine or {})}
        if theirs != mine:
            out.append(f"{key}: existing {theirs!r}, this run {mine!r}")
    return out


def seeds_in(result: Mapping) -> list[int]:
    seeds: set[int] = set()
    for m in (result.get("modes") or {}).values():
        seeds.update(int(r["seed"]) for r in m.get("seeds", []))
    return sorted(seeds)


def assemble(record: Mapping, ident: Mapping, targets: Mapping, runs: Mapping[str, Sequence[Mapping]],
             prompt_order: Mapping[str, Mapping], parts: Sequence[Mapping], smoke: bool = False) -> dict:
    """The whole result from its runs (``runs``: mode -> one run summary per seed)."""
    budget = float(ident["budget_s"])
    overrides = ident.get("mode_overrides", {})
    modes = {}
    for mode in ident["modes"]:
        if mode in runs:
            modes[mode] = summary.mode_summary(runs[mode], budget, ident["placements"].get(mode, {}),
                                               overrides.get(mode, []))
    return {
        **dict(record),
        "benchmark": "learn",
        "smoke": smoke,
        "identity": dict(ident),
        "clock": {"rule": clock.RULE, "budget_s": budget, "marks_s": ident["marks_s"]},
        "targets": dict(targets),
        "prompt_order": {"rule": prompts.RULE, "seeds": {str(k): dict(v) for k, v in prompt_order.items()}},
        "modes": modes,
        "parts": list(parts),
        "fields": FIELDS,
    }


def merge(existing: Mapping, new: Mapping) -> dict:
    """``existing`` with ``new``'s seeds added (a seed already in ``existing`` is refused)."""
    clash = sorted(set(seeds_in(existing)) & set(seeds_in(new)))
    if clash:
        raise ValueError(f"seeds {clash} are already in the existing result; pass other seeds (--seed-list)")
    runs = {m: list(existing["modes"].get(m, {}).get("seeds", [])) + list(new["modes"].get(m, {}).get("seeds", []))
            for m in existing["identity"]["modes"]}
    order = {**existing.get("prompt_order", {}).get("seeds", {}), **new.get("prompt_order", {}).get("seeds", {})}
    record = {k: existing[k] for k in ("date", "machine", "command", "commit", "load_avg_at_start") if k in existing}
    merged = assemble(record, existing["identity"], existing["targets"], runs, order,
                      list(existing.get("parts", [])) + list(new.get("parts", [])), existing.get("smoke", False))
    if existing.get("pictures"):
        merged["pictures"] = copy.deepcopy(existing["pictures"])
    return merged


FIELDS = {
    "modes.<mode>.placement": "cores (the host's, shared by every process of the run) and logical Ray GPUs",
    "modes.<mode>.overrides": "Hydra overrides of this mode beyond its recipe and the plumbing (identity.plumbing)",
    "modes.<mode>.seeds[]": "one run per seed: curve (per step within the budget: step, t_s on the clock, reward = "
                            "critic/score/mean, reward_smoothed, tokens = perf/total_num_tokens), heldout (per "
                            "mark: mark_s, the weights version published at or before it, greedy accuracy, rows), "
                            "tokens_per_s (trained tokens within the budget / budget), step_time_s, "
                            "staleness_histogram, prompts (counts, covered prefix, sha256), times to target, "
                            "response_length (Laminar modes: response tokens of the finished trajectories against "
                            "the trained ones, p50/p99/max, from its timeline; trained None where the timeline's "
                            "step records carry no lengths)",
    "modes.<mode>.prompt_fingerprint": "seed -> sha256 of the prompt ids over the prefix every mode of that "
                                       "seed's part trained (prompt_order says how)",
    "modes.<mode>.time_to_reward_target_s": "over seeds: median_s, min_s, max_s (None when a seed did not reach "
                                            "it), reached, per_seed_s",
    "modes.<mode>.time_to_heldout_target_s": "the same for the held-out target (resolution: the marks)",
    "modes.<mode>.staleness_histogram": "staleness k -> trained trajectories, summed over seeds; k = verl's lag at "
                                        "training time (training/off_policy/trajectory_staleness), every mode",
    "modes.<mode>.laminar_staleness_n_minus_j": "Laminar modes: its own n - j (versions published while the "
                                                "trajectory was generated), summed over seeds",
    "targets": "reward and held-out targets, the warm start's values they came from, margins and the rule",
    "prompt_order.seeds.<seed>": "common_prefix (prompt occurrences every mode trained) and equal (fingerprints)",
    "parts[]": "per part (one seed, every mode on one machine): seed, provenance, wall_s",
}


def plumbing_note(keys: Sequence[str]) -> dict:
    return {"keys": list(keys), "about": "the only config keys in which a mode's run differs from its recipe run "
                                         "plainly with the same workload environment (a test diffs them)"}


def part_record(seed: int, record: Mapping, wall_s: float, notes: Optional[Sequence[str]] = None) -> dict:
    return {"seed": seed, "provenance": dict(record), "wall_s": round(wall_s, 1), "notes": list(notes or [])}
