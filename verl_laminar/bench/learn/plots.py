"""The learning benchmark's pictures, from its result JSON (matplotlib's Agg canvas, as ``report.plots``):

* ``reward``: training reward (trailing mean over the target's window) against the clock, every mode on one
  plot, the line the mean over seeds and the band their min..max (on a common grid: each seed's last value at or
  before each time), the reward target dashed;
* ``heldout``: held-out greedy accuracy at the marks, mean over seeds with the min..max band, the target dashed;
* ``staleness``: the trained trajectories' staleness per mode, summed over seeds: left, verl's lag at training
  time (one definition for every mode); right, Laminar's own ``n - j`` for the Laminar modes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping, Optional, Sequence

from verl_laminar.report import plots as rp

PICTURES = ("reward", "heldout", "staleness")


def step_value(ts: Sequence[float], vs: Sequence[Optional[float]], t: float) -> Optional[float]:
    """A seed's value at time ``t``: its last value at or before ``t`` (None before its first)."""
    out = None
    for ti, vi in zip(ts, vs):
        if ti > t:
            break
        if vi is not None:
            out = vi
    return out


def band(series: Sequence[tuple[Sequence[float], Sequence[Optional[float]]]], grid: Sequence[float]
         ) -> tuple[list[float], list[float], list[float], list[float]]:
    """Mean, min and max over seeds on ``grid`` (times where no seed has a value yet are left out)."""
    xs, mean, lo, hi = [], [], [], []
    for t in grid:
        vals = [v for v in (step_value(ts, vs, t) for ts, vs in series) if v is not None]
        if vals:
            xs.append(t)
            mean.append(sum(vals) / len(vals))
            lo.append(min(vals))
            hi.append(max(vals))
    return xs, mean, lo, hi


def _meta(result: Mapping, picture: str, source: Optional[str]) -> dict[str, str]:
    desc = {"date": result.get("date"), "commit": result.get("commit"), "picture": picture,
            "modes": list(result.get("modes", {}))}
    out = {"Title": f"learn {picture}", "Description": json.dumps(desc, sort_keys=True)}
    if source:
        out["Source"] = source
    return out


def _footer(result: Mapping, source: Optional[str]) -> str:
    seeds = sorted({r["seed"] for m in result["modes"].values() for r in m["seeds"]})
    parts = [f"seeds {seeds}", f"budget {result['clock']['budget_s']:.0f} s"]
    if result.get("commit"):
        parts.append(f"commit {str(result['commit'])[:12]}")
    if result.get("date"):
        parts.append(str(result["date"]))
    if source:
        parts.append(f"from {source}")
    return ", ".join(parts)


def reward_figure(result: Mapping, footer: str, colors: Mapping[str, str]):
    fig, (ax,) = rp._figure()
    budget = float(result["clock"]["budget_s"])
    grid = [budget * i / 400 for i in range(401)]
    for mode, m in result["modes"].items():
        for r in m["seeds"]:  # every step's own reward, faint
            ax.scatter(r["curve"]["t_s"], r["curve"]["reward"], s=16, color=colors[mode], alpha=0.45, linewidths=0)
        series = [(r["curve"]["t_s"], r["curve"]["reward_smoothed"]) for r in m["seeds"]]
        xs, mean, lo, hi = band(series, grid)
        label = f"{mode} ({len(series)} seed{'s' if len(series) != 1 else ''})"
        if not xs:
            ax.scatter([], [], color=colors[mode], label=f"{label}: steps only, no whole window yet")
            continue
        ax.plot(xs, mean, color=colors[mode], label=label, drawstyle="steps-post")
        if len(series) > 1:
            ax.fill_between(xs, lo, hi, color=colors[mode], alpha=0.18, step="post")
    ax.axhline(result["targets"]["reward"], color="black", linestyle="--", linewidth=0.9, label="reward target")
    window = result["targets"].get("reward_window_steps")
    ax.set_xlabel("wall-clock seconds since the first dispatch (checkpoint saves left out)")
    ax.set_ylabel(f"training reward: dots each step, line the mean of the last {window}")
    ax.set_title("Training reward against wall-clock (line: mean over seeds; band: min..max)")
    ax.set_xlim(0, budget)
    ax.legend(fontsize=9)
    fig.subplots_adjust(bottom=0.15)
    rp._footer(fig, footer)
    return fig


def heldout_figure(result: Mapping, footer: str, colors: Mapping[str, str]):
    fig, (ax,) = rp._figure()
    for mode, m in result["modes"].items():
        marks = sorted({p["mark_s"] for r in m["seeds"] for p in r["heldout"]})
        xs, mean, lo, hi = [], [], [], []
        for t in marks:
            vals = [p["accuracy"] for r in m["seeds"] for p in r["heldout"]
                    if p["mark_s"] == t and p.get("accuracy") is not None]
            if vals:
                xs.append(t)
                mean.append(sum(vals) / len(vals))
                lo.append(min(vals))
                hi.append(max(vals))
        if not xs:
            continue
        n = len(m["seeds"])
        ax.plot(xs, mean, marker="o", color=colors[mode], label=f"{mode} ({n} seed{'s' if n != 1 else ''})")
        if n > 1:
            ax.fill_between(xs, lo, hi, color=colors[mode], alpha=0.18)
        else:  # one seed: the version each mark read
            for p in m["seeds"][0]["heldout"]:
                if p.get("accuracy") is not None and p["mark_s"] > 0:
                    ax.annotate(f"v{p['version']}", (p["mark_s"], p["accuracy"]), textcoords="offset points",
                                xytext=(4, 4), fontsize=7, color=colors[mode])
    ax.axhline(result["targets"]["heldout"], color="black", linestyle="--", linewidth=0.9, label="held-out target")
    ax.set_xlabel("wall-clock mark (s): the weights version published at or before it")
    ax.set_ylabel("held-out greedy accuracy")
    ax.set_title("Held-out accuracy at wall-clock marks (line: mean over seeds; band: min..max)")
    ax.legend(fontsize=9)
    fig.subplots_adjust(bottom=0.15)
    rp._footer(fig, footer)
    return fig


def _bars(ax, counts: Mapping[str, Mapping[int, int]], colors: Mapping[str, str]) -> None:
    ks = sorted({k for c in counts.values() for k in c}) or [0]
    width = 0.8 / max(1, len(counts))
    for i, (mode, c) in enumerate(counts.items()):
        xs = [k - 0.4 + width * (i + 0.5) for k in ks]
        ys = [c.get(k, 0) for k in ks]
        bars = ax.bar(xs, ys, width=width, color=colors[mode], label=f"{mode} ({sum(ys)})")
        ax.bar_label(bars, fontsize=7, padding=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_ylabel("trained trajectories")
    ax.margins(y=0.12)
    ax.legend(fontsize=8)


def staleness_figure(result: Mapping, footer: str, colors: Mapping[str, str]):
    fig, (left, right) = rp._figure(2)
    lag = {mode: {int(k): v for k, v in m["staleness_histogram"].items()} for mode, m in result["modes"].items()}
    _bars(left, lag, colors)
    left.set_xlabel("versions the trainer was ahead when it trained it")
    left.set_title("Staleness at training (verl's metric, every mode)", fontsize=10)
    own = {mode: {int(k): v for k, v in m["laminar_staleness_n_minus_j"].items()}
           for mode, m in result["modes"].items() if m.get("laminar_staleness_n_minus_j")}
    if own:
        _bars(right, own, colors)
        right.set_xlabel("n - j: versions published while it was generated")
        right.set_title("Laminar's n - j (its time in the buffer not counted)", fontsize=10)
    else:
        right.set_axis_off()
    fig.subplots_adjust(bottom=0.15, wspace=0.25)
    rp._footer(fig, footer)
    return fig


def write(result: Mapping, out_dir: Path, prefix: str = "", source: Optional[str] = None) -> list[Path]:
    """The three pictures as ``<out_dir>/<prefix><picture>.png``; returns the paths written."""
    colors = rp.mode_colors(list(result["modes"]))
    footer = _footer(result, source)
    figures = [("reward", reward_figure(result, footer, colors)), ("heldout", heldout_figure(result, footer, colors))]
    if any(m["staleness_histogram"] for m in result["modes"].values()):
        figures.append(("staleness", staleness_figure(result, footer, colors)))
    return [rp.save(fig, out_dir / f"{prefix}{name}.png", _meta(result, name, source)) for name, fig in figures]
