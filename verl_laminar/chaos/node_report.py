"""The emulated-cluster chaos run's report (``chaos.nodes``): pure parsing and arithmetic over the run's console,
the harness's event log, the run's timeline (generation) and its step file (training).

Per machine kill: ``detect_s`` (the kill until the router declared the last of that machine's replicas dead),
``first_replacement_token_s`` (the kill until a replacement streamed its first token), ``replacement_node`` (the
address its processes ran on: the machine that joined, or not), ``generation_recovered_s`` (the kill until the
generated tokens of a ``WINDOW_S`` window, wholly after the kill, reach 90% of the window's before it) and the
training throughput from the kill to that recovery against before it. Per partition: which replicas were on the
cut machine, when each was declared dead, and whether any result of theirs was trained after the cut.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any, Optional, Sequence

from verl_laminar.chaos.report import DIED, REPLACED, build_report, stamped

WINDOW_S = 30.0
RECOVERED = 0.9
RUNS_ON = re.compile(r"laminar: replica (\d+) runs on node ([\d.]+|\?) ")
FIRST_TOKEN = re.compile(r"laminar: replica (\d+) streams: its first token")
KILLED = re.compile(r"laminar\.chaos: killed node (\w+) \(([\d.]+)\)")
JOINED = re.compile(r"laminar\.chaos: node (\w+) \(([\d.]+)\) joined")
PARTED = re.compile(r"laminar\.chaos: partitioned node (\w+) \(([\d.]+)\)")
HEALED = re.compile(r"laminar\.chaos: healed node (\w+) \(([\d.]+)\)")
LEDGER = re.compile(r"laminar: ledger at the end (\{[^}]*\})")


def placements(events: Sequence[tuple[float, str]], before: float) -> dict[int, str]:
    """Each replica's node address as last logged before ``before``."""
    out: dict[int, str] = {}
    for t, msg in events:
        m = RUNS_ON.search(msg)
        if m and t <= before:
            out[int(m.group(1))] = m.group(2)
    return out


def first_after(events: Sequence[tuple[float, str]], pattern: re.Pattern, t0: float, rid: int) -> Optional[float]:
    for t, msg in events:
        m = pattern.search(msg)
        if m and t >= t0 and int(m.group(1)) == rid:
            return t
    return None


def generation_tokens(trajectories: Sequence[tuple[float, int]], t0: float, t1: float) -> int:
    return sum(n for end, n in trajectories if t0 < end <= t1)


def generation_recovered(trajectories: Sequence[tuple[float, int]], t_kill: float,
                         window_s: float = WINDOW_S, share: float = RECOVERED) -> tuple[float, Optional[float]]:
    """(tokens/s in the window before the kill, seconds from the kill until a window wholly after it reached
    ``share`` of that; None if none did). Windows end at each trajectory's end."""
    before = generation_tokens(trajectories, t_kill - window_s, t_kill) / window_s
    for end, _ in sorted(trajectories):
        if end - window_s < t_kill:
            continue
        if generation_tokens(trajectories, end - window_s, end) / window_s >= share * before > 0:
            return before, round(end - t_kill, 1)
    return before, None


def training_rate(steps: Sequence[tuple[float, float]], t0: float, t1: float) -> Optional[float]:
    """Trained tokens/s over the steps that ended in [t0, t1]: all but the first one's tokens over the time from
    the first to the last (None with fewer than 2 steps there)."""
    inside = sorted(s for s in steps if t0 <= s[0] <= t1)
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return None
    return round(sum(n for _, n in inside[1:]) / (inside[-1][0] - inside[0][0]), 1)


def machine_kill(events, t_kill: float, address: str, joined: Optional[str], trajectories, steps,
                 t_end: float) -> dict:
    victims = sorted(r for r, a in placements(events, t_kill).items() if a == address)
    died = {r: first_after(events, DIED, t_kill, r) for r in victims}
    new = {}
    for t, msg in events:
        m = REPLACED.search(msg)
        if m and t >= t_kill and int(m.group(2)) in victims:
            new[int(m.group(2))] = int(m.group(1))
    placed_after = placements(events, t_end)
    tokens = {n: first_after(events, FIRST_TOKEN, t_kill, n) for n in new.values()}
    first = min((t for t in tokens.values() if t is not None), default=None)
    before, recovered = generation_recovered(trajectories, t_kill)
    until = t_kill + recovered if recovered is not None else t_end
    return {
        "t": t_kill, "node_address": address, "replicas": victims,
        "detect_s": None if not died or None in died.values() else round(max(died.values()) - t_kill, 2),
        "replacements": {str(k): v for k, v in new.items()},
        "replacement_nodes": sorted({placed_after.get(n, "?") for n in new.values()}),
        "replacement_on_joined_node": bool(new) and joined is not None and
        all(placed_after.get(n) == joined for n in new.values()),
        "first_replacement_token_s": None if first is None else round(first - t_kill, 2),
        "generation_tokens_per_s_before": round(before, 1),
        "generation_recovered_s": recovered,
        "training_tokens_per_s_before": training_rate(steps, t_kill - 4 * WINDOW_S, t_kill),
        "training_tokens_per_s_until_recovered": training_rate(steps, t_kill, until),
    }


def partition(events, t_cut: float, t_heal: Optional[float], address: str, t_end: float) -> dict:
    victims = sorted(r for r, a in placements(events, t_cut).items() if a == address)
    died = {r: first_after(events, DIED, t_cut, r) for r in victims}
    return {"t": t_cut, "healed_s": None if t_heal is None else round(t_heal - t_cut, 1), "node_address": address,
            "replicas": victims,
            "detect_s": None if not died or None in died.values() else round(max(died.values()) - t_cut, 2),
            "declared_dead": [r for r, t in died.items() if t is not None]}


def build(launch_log: Path, harness_log: Path, local_dir: Path, addresses: dict[str, str], t0: float, t1: float,
          steps: int) -> dict:
    from verl_laminar.report.runlog import RunRecord
    from verl_laminar.stepfile import read_step_file
    from verl_laminar.timeline import TrajectorySpan, default_path, read_timeline

    text = launch_log.read_text(errors="replace")
    events = sorted(stamped(text) + stamped(harness_log.read_text(errors="replace")))
    step_path = local_dir / "laminar_metrics.jsonl"
    lines = read_step_file(step_path) if step_path.exists() else []
    step_pts = [(s.t, float(s.metrics.get("perf/total_num_tokens", 0.0))) for s in lines]
    tl_path = Path(default_path(str(local_dir)))
    trajectories = [(r.end, int(r.response_tokens)) for r in (read_timeline(tl_path) if tl_path.exists() else [])
                    if isinstance(r, TrajectorySpan)]
    joined = [(t, m.group(2)) for t, msg in events if (m := JOINED.search(msg))]
    kills = []
    for t, msg in events:
        m = KILLED.search(msg)
        if m:
            after = next((a for tj, a in joined if tj >= t), None)
            kills.append(machine_kill(events, t, m.group(2), after, trajectories, step_pts, t1))
    heals = [(t, m.group(2)) for t, msg in events if (m := HEALED.search(msg))]
    parts = []
    for t, msg in events:
        m = PARTED.search(msg)
        if m:
            heal = next((th for th, a in heals if a == m.group(2) and th >= t), None)
            parts.append(partition(events, t, heal, m.group(2), t1))
    record = RunRecord.from_step_file("laminar", step_path, started=t0) if step_path.exists() else RunRecord("laminar")
    base = build_report([], steps, [{"t0": t0, "record": record, "log": launch_log}], t0, t1)
    ledger_m = LEDGER.search(text)
    ledger: dict[str, Any] = ast.literal_eval(ledger_m.group(1)) if ledger_m else {}
    return {**base, "addresses": addresses, "machine_kills": len(kills), "partitions": len(parts),
            "replacement_nodes_joined": sum(k["replacement_on_joined_node"] for k in kills),
            "machine_kill": kills, "partition": parts, "ledger_at_end": ledger,
            "lost": base["lost_groups"], "mixed_version": base["mixed_version_steps"],
            "window_s": WINDOW_S, "recovered_share": RECOVERED}
