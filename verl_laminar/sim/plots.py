"""Plots of a grid run: throughput vs GPUs, Laminar's staleness histogram, a Gantt timeline of one step.

matplotlib only, on the non-interactive Agg backend, written as PNG under the ``--out`` directory.
Every figure is titled SIMULATED.
"""

from __future__ import annotations

import logging
from pathlib import Path

from verl_laminar.sim.params import SimParams
from verl_laminar.sim.systems import Setup, default_layout, simulate

logger = logging.getLogger(__name__)

_COLORS = {"sync": "#7f7f7f", "one_step": "#1f77b4", "streaming": "#17becf", "areal": "#ff7f0e",
           "laminar": "#d62728", "laminar_norepack": "#e377c2", "laminar_norelay": "#9467bd"}
_KINDS = {"gen": "#2ca02c", "weights": "#d62728", "idle": "#dddddd", "repack": "#9467bd", "interrupt": "#ff7f0e",
          "train": "#1f77b4", "publish": "#000000", "bcast": "#8c564b"}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def throughput_plot(rows: list[dict], path: Path) -> Path:
    plt = _plt()
    panels = sorted({(r["task"], r["model"]) for r in rows}, key=lambda x: (x[0], int(x[1][:-1])))
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.4), squeeze=False)
    for ax, (task, model) in zip(axes[0], panels):
        for system in _COLORS:
            pts = sorted((r["gpus"], r["throughput"]) for r in rows
                         if r["task"] == task and r["model"] == model and r["system"] == system)
            if pts:
                ax.plot([g for g, _ in pts], [x / 1e3 for _, x in pts], "o-", ms=3, label=system, color=_COLORS[system])
        ax.set_xscale("log", base=2)
        ax.set_title(f"{model} {task}", fontsize=9)
        ax.set_xlabel("GPUs")
        ax.set_ylabel("k tokens / s")
    axes[0][0].legend(fontsize=6)
    fig.suptitle("SIMULATED throughput vs GPUs (each system at its best split)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def staleness_plot(hist: dict, path: Path) -> Path:
    plt = _plt()
    ks = sorted(int(k) for k in hist)
    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    total = sum(hist.values()) or 1
    ax.bar(ks, [hist[str(k)] / total for k in ks] if isinstance(next(iter(hist)), str) else [hist[k] / total for k in ks],
           color=_COLORS["laminar"])
    ax.set_xlabel("staleness n - j (steps)")
    ax.set_ylabel("fraction of trajectories")
    ax.set_title("SIMULATED Laminar staleness, math grid", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def gantt_plot(traces: dict[str, list], path: Path, max_rollouts: int = 24) -> Path:
    """One panel per system: rollout rows (and the trainer, row -1) coloured by what they do."""
    plt = _plt()
    fig, axes = plt.subplots(len(traces), 1, figsize=(10, 2.6 * len(traces)), squeeze=False)
    for ax, (name, (trace, window)) in zip(axes[:, 0], traces.items()):
        a, b = window
        for rid, kind, s, e in trace:
            if rid >= max_rollouts or e < a or s > b:
                continue
            y = -1.5 if rid < 0 else rid
            ax.broken_barh([(max(s, a), min(e, b) - max(s, a))], (y - 0.4, 0.8), color=_KINDS.get(kind, "k"))
        ax.set_xlim(a, b)
        ax.set_ylim(max_rollouts, -2.5)
        ax.set_title(f"SIMULATED {name}: trainer (top) and first {max_rollouts} rollouts", fontsize=9)
        ax.set_xlabel("seconds")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in _KINDS.values()]
    axes[0, 0].legend(handles, list(_KINDS), fontsize=6, ncol=4, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_all(rows: list[dict], summary: dict, out: Path, seed: int, p: SimParams,
              model: str = "32b", gpus: int = 128) -> dict[str, str]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"throughput": throughput_plot(rows, out / "throughput_vs_gpus.png"),
             "staleness": staleness_plot(summary["staleness_laminar_math"]["hist"], out / "staleness_hist.png")}
    splits = {r["system"]: r["trainer_gpus"] for r in rows if r["model"] == model and r["gpus"] == gpus and r["task"] == "math"}
    traces = {}
    for system in ("sync", "areal", "laminar"):
        colocated = system == "sync"
        lay = default_layout(model, gpus, splits.get(system, gpus // 2), p, colocated=colocated)
        res = simulate(system, Setup(model, "math", lay, seed, p, trace=True))
        pubs = sorted(e for rid, kind, s, e in res.trace if rid == -1 and kind in ("train", "publish"))
        # one step in steady state: between the last two publications (sync: its second step)
        end = res.step_time * 2 if colocated else (pubs[-1] if pubs else res.step_time)
        traces[f"{system} ({model}, {gpus} GPUs, trainer {lay.trainer_gpus})"] = (res.trace, (max(0.0, end - 1.5 * res.step_time), end))
    paths["gantt"] = gantt_plot(traces, out / "gantt_one_step.png")
    logger.info("plots written under %s", out)
    return {k: str(v) for k, v in paths.items()}
