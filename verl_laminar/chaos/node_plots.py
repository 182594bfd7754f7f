"""The pictures of a ``chaos --nodes`` run: the replicas' timeline and the generated tokens/s over wall time, each
with the machine faults marked (the kill, the new machine's join, the partition and its heal).

    pictures(local_dir, harness_log, out_prefix, footer) -> [png paths]

The timeline is ``report.plots.timeline`` (from the run's timeline file); the marks are the harness's stamped events.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from verl_laminar.chaos.node_report import HEALED, JOINED, KILLED, PARTED, WINDOW_S, generation_tokens
from verl_laminar.chaos.report import stamped

_MARKS = ((KILLED, "machine killed", "#d62728"), (JOINED, "machine joined", "#2ca02c"),
          (PARTED, "partitioned", "#9467bd"), (HEALED, "link back", "#8c564b"))


def marks(harness_text: str) -> list[tuple[float, str, str]]:
    """(Unix time, label, colour) of each machine fault the harness logged."""
    out = []
    for t, msg in stamped(harness_text):
        for pattern, label, color in _MARKS:
            m = pattern.search(msg)
            if m:
                out.append((t, f"{m.group(1)} {label}", color))
    return out


def _mark(ax, origin: float, found: Sequence[tuple[float, str, str]]) -> None:
    from matplotlib.transforms import blended_transform_factory

    top = blended_transform_factory(ax.transData, ax.transAxes)
    for t, label, color in found:
        ax.axvline(t - origin, color=color, linewidth=1.6)
        ax.text(t - origin, 0.02, " " + label, transform=top, rotation=90, fontsize=8, color=color, va="bottom")


def pictures(local_dir: Path, harness_log: Path, out_prefix: str, footer: str) -> list[Path]:
    from verl_laminar.report import plots
    from verl_laminar.report.series import timeline_series
    from verl_laminar.timeline import TrajectorySpan, default_path, read_timeline

    records = read_timeline(default_path(str(local_dir)))
    series = timeline_series(records)
    if series is None:
        return []
    found = marks(harness_log.read_text(errors="replace"))
    meta = {"Title": "chaos --nodes", "Description": footer}
    fig = plots.timeline(series, "Laminar on 3 emulated machines", footer)
    _mark(fig.axes[0], series.origin, found)
    paths = [plots.save(fig, Path(f"{out_prefix}_timeline.png"), meta)]
    trajs = sorted((r.end, int(r.response_tokens)) for r in records if isinstance(r, TrajectorySpan))
    fig, (ax,) = plots._figure()
    xs = [end - series.origin for end, _ in trajs if end - WINDOW_S >= trajs[0][0]]
    ys = [generation_tokens(trajs, end - WINDOW_S, end) / WINDOW_S for end, _ in trajs if end - WINDOW_S >= trajs[0][0]]
    ax.plot(xs, ys, color="#1f77b4", linewidth=1.2, label=f"generated tokens/s (the last {WINDOW_S:.0f} s)")
    _mark(ax, series.origin, found)
    ax.set_xlabel("seconds since the trainer started")
    ax.set_ylabel("generated response tokens per second")
    ax.set_title("Generation over wall time around the machine faults")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    fig.subplots_adjust(bottom=0.17)
    plots._footer(fig, footer)
    paths.append(plots.save(fig, Path(f"{out_prefix}_generation.png"), meta))
    return paths
