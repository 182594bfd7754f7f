"""The report's four pictures, drawn from ``report.series`` with matplotlib's Agg canvas (no display, no pyplot
state: a library call must not change the caller's backend). One figure each, 1000 x 500 px."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Mapping

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator
from matplotlib.transforms import blended_transform_factory

from verl_laminar.report.series import GENERATING, LOADING, TimelineSeries, TokenSeries, WaitSeries

SIZE_IN, DPI = (10.0, 5.0), 100
_IDLE, _LOAD = "#eeeeee", "#555555"
_MAX_VERSION_KEYS = 8  # more versions than this: the legend names the states only, bars carry their labels


def _figure(ncols: int = 1) -> tuple[Figure, list]:
    fig = Figure(figsize=SIZE_IN, dpi=DPI)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, list(axes)


def _footer(fig: Figure, text: str) -> None:
    fig.text(0.01, 0.01, text, fontsize=7, color="#666666", ha="left", va="bottom")


def mode_colors(names) -> dict[str, str]:
    """One colour per mode, the same in every picture of a report (pass all the run's modes, in order)."""
    cycle = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
    return {n: cycle[i % len(cycle)] for i, n in enumerate(names)}


def _version_color(v) -> str:
    palette = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c",
               "#ccb974", "#64b5cd"]
    return palette[int(v) % len(palette)] if v is not None else _IDLE


def save(fig: Figure, path: Path, metadata: Mapping[str, str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=DPI, metadata=dict(metadata))
    return path


def timeline(series: TimelineSeries, mode: str, footer: str) -> Figure:
    fig, (ax,) = _figure()
    span = max(series.end, 1e-9)
    versions = set()
    for row, lane in enumerate(series.lanes):
        for seg in lane.segments:
            width = seg.end - seg.start
            if seg.state == GENERATING:
                versions.add(seg.version)
                ax.broken_barh([(seg.start, width)], (row - 0.4, 0.8), facecolors=_version_color(seg.version))
                label = f"v{seg.version}"
            elif seg.state == LOADING:
                ax.broken_barh([(seg.start, width)], (row - 0.4, 0.8), facecolors=_LOAD, hatch="///",
                               edgecolor="white", linewidth=0)
                label = f"\u2192v{seg.version}"
            else:
                ax.broken_barh([(seg.start, width)], (row - 0.4, 0.8), facecolors=_IDLE)
                label = ""
            if label and width > span * 0.035:  # only where the label fits inside the bar
                ax.text(seg.start + width / 2, row, label, ha="center", va="center", fontsize=7,
                        color="white")
    top = blended_transform_factory(ax.transData, ax.transAxes)
    for t, v in series.publications:
        ax.axvline(t, color="black", linestyle="--", linewidth=0.8, alpha=0.7)
        ax.text(t, 1.01, f"v{v}", transform=top, ha="center", va="bottom", fontsize=7)
    ax.set_yticks(range(len(series.lanes)), [f"replica {lane.replica}" for lane in series.lanes])
    ax.set_ylim(-0.6, len(series.lanes) - 0.4)
    ax.invert_yaxis()
    ax.set_xlim(0, span)
    start = datetime.datetime.fromtimestamp(series.origin, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    ax.set_xlabel(f"seconds since the trainer started ({start} UTC)")
    ax.set_title(f"{mode}: rollout replicas over wall time (dashed: the trainer publishes version vN)", pad=14)
    handles = [Patch(facecolor=_LOAD, hatch="///", edgecolor="white", label="loading weights (\u2192vN)"),
               Patch(facecolor=_IDLE, edgecolor="#bbbbbb", label="idle")]
    if len(versions) <= _MAX_VERSION_KEYS:
        handles = [Patch(facecolor=_version_color(v), label=f"generating, v{v}") for v in sorted(versions)] + handles
    else:
        handles = [Patch(facecolor=_version_color(0), label="generating (vN)")] + handles
    handles.append(Line2D([], [], color="black", linestyle="--", linewidth=0.8, label="publication"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.subplots_adjust(left=0.1, right=0.8, bottom=0.15, top=0.88)
    _footer(fig, footer)
    return fig


def staleness(counts: Mapping[str, Mapping[int, int]], footer: str, colors: Mapping[str, str]) -> Figure:
    fig, (ax,) = _figure()
    ks = sorted({k for c in counts.values() for k in c})
    width = 0.8 / max(1, len(counts))
    for i, (mode, c) in enumerate(counts.items()):
        xs = [k - 0.4 + width * (i + 0.5) for k in ks]
        ys = [c.get(k, 0) for k in ks]
        bars = ax.bar(xs, ys, width=width, color=colors[mode], label=f"{mode} ({sum(ys)} trajectories)")
        ax.bar_label(bars, fontsize=8, padding=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_xlabel("staleness k = trainer steps published while the trajectory was generated")
    ax.set_ylabel("trained trajectories")
    ax.set_title("Staleness of the trained trajectories")
    ax.margins(y=0.12)
    ax.legend(fontsize=9)
    fig.subplots_adjust(bottom=0.15)
    _footer(fig, footer)
    return fig


def waits(series: Mapping[str, WaitSeries], footer: str, colors: Mapping[str, str]) -> Figure:
    fig, (left, right) = _figure(2)
    for mode, w in series.items():
        label = f"{mode} (from timing_s/*)" if w.derived else mode
        style = dict(color=colors[mode], marker="o", markersize=3, linestyle=":" if w.derived else "-")
        left.plot(w.steps, w.wait_for_data_s, label=label, **style)
        right.plot(w.steps, w.wait_for_weights_s, label=label, **style)
    left.set_title("Trainer waits for data")
    right.set_title("Rollout replicas wait for weights")
    for ax in (left, right):
        ax.set_xlabel("training step")
        ax.set_ylabel("seconds in the step")
        ax.set_ylim(bottom=0)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if any(w.derived for w in series.values()):
        footer += "  |  dotted (sync): trainer waits during timing_s/gen, rollouts during the rest of the step"
    fig.subplots_adjust(bottom=0.17, wspace=0.25)
    _footer(fig, footer)
    return fig


def tokens_per_s(series: Mapping[str, TokenSeries], footer: str, colors: Mapping[str, str]) -> Figure:
    fig, (ax,) = _figure()
    for mode, s in series.items():
        ax.plot(s.steps, s.tokens_per_s, marker="o", markersize=4, color=colors[mode], label=f"{mode}")
        if s.steady_tokens_per_s:
            ax.axhline(s.steady_tokens_per_s, color=colors[mode], linestyle="--", linewidth=0.8,
                       label=f"{mode} steady state {s.steady_tokens_per_s:.1f} tok/s")
    methods = sorted({s.method for s in series.values()})
    ax.set_xlabel("training step")
    ax.set_ylabel("trained tokens per second")
    ax.set_title("Training throughput per step")
    ax.set_ylim(bottom=0)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.subplots_adjust(bottom=0.17)
    _footer(fig, footer + "  |  " + "; ".join(methods))
    return fig
