"""``make demo``: Laminar and verl's synchronous trainer side by side on the CPU fixtures, on one screen.

    python -m verl_laminar.bench.demo                   # paper-regime workload, its 24 steps each, runs/demo/
    python -m verl_laminar.bench.demo --results docs/results  # also the committed JSON + pictures

Dataflow: bench.e2e.run (the benchmark's own loop: one recipe run per mode, console lines into
runs/demo/<mode>.log, summaries, result JSON, report pictures) with a progress callback that prints one line per
finished step and an estimate of what remains -> summary_lines (pure) -> the console. verl's and vLLM's start-up
output stays in the logs.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Optional

from verl_laminar import metrics as lm
from verl_laminar.bench import e2e
from verl_laminar.platform.procs import exit_on_sigterm

logger = logging.getLogger("verl_laminar.bench.demo")
REPO = Path(__file__).resolve().parents[2]
# Seconds from launch to the first step line on this kind of host (engines, FSDP, the first step), used for
# the estimate until a mode has measured its own.
STARTUP_GUESS_S = 150.0
BREAKDOWN = (("gen", "timing_s/gen"), ("old_log_prob", "timing_s/old_log_prob"),
             ("update", "timing_s/update_actor"), ("weights", "timing_s/update_weights"))


def _mmss(s: float) -> str:
    s = max(0, int(round(s)))
    return f"{s // 60:d}:{s % 60:02d}"


class Eta:
    """What remains of the demo: the current mode from its own step times, the modes after it from the first
    mode's whole duration (or the start-up guess)."""

    def __init__(self, modes: list[str], steps: int, clock=time.monotonic) -> None:
        self.modes, self.steps, self.clock = modes, steps, clock
        self.t0 = clock()
        self.mode_t0: dict[str, float] = {}
        self.step_t: dict[str, dict[int, float]] = {}
        self.durations: list[float] = []

    def start(self, mode: str) -> None:
        self.mode_t0[mode] = self.clock()
        self.step_t[mode] = {}

    def step(self, mode: str, step: int, t: float) -> None:
        self.step_t[mode][step] = t

    def end(self, mode: str) -> None:
        self.durations.append(self.clock() - self.mode_t0[mode])

    def remaining_s(self, mode: str) -> float:
        seen = self.step_t.get(mode, {})
        elapsed = self.clock() - self.mode_t0.get(mode, self.clock())
        if len(seen) >= 2:
            times = [seen[k] for k in sorted(seen)]
            per_step = (times[-1] - times[0]) / (len(times) - 1)
            this = per_step * (self.steps - max(seen))
        elif len(seen) == 1:
            this = (next(iter(seen.values())) / 3.0) * (self.steps - 1)  # step 1 carries start-up
        else:
            this = max(0.0, STARTUP_GUESS_S - elapsed) + 10.0 * self.steps
        later = self.modes[self.modes.index(mode) + 1:]
        each = sum(self.durations) / len(self.durations) if self.durations else STARTUP_GUESS_S + 10.0 * self.steps
        return this + each * len(later)


def shown(step: int, steps: int, lines: int = 8) -> bool:
    """Whether the console reports this step: the first, the last and about ``lines`` in all, so a long run's
    progress still fits on a screen with the summary."""
    every = max(1, steps // lines)
    return step == 1 or step == steps or step % every == 0


def summary_lines(result: dict, pictures: list[Path], out: Path) -> list[str]:
    """The demo's last screen, from the benchmark's result JSON."""
    w = result["workload"]
    lengths = w["lengths"]
    lines = [f"Laminar vs verl's synchronous GRPO: workload {w['name']!r}, {w['prompts_per_step']} prompts x "
             f"{w['responses_per_prompt']} responses per step, response lengths p50 {lengths['p50']} / p99 "
             f"{lengths['p99']} (cap {lengths['cap']}) tokens; {result['machine']['cpus']} CPU cores "
             f"({result['machine']['cpu_model']})",
             "",
             f"{'mode':<16}{'tokens/s':>9}{'step s':>8}" + "".join(f"{name:>13}" for name, _ in BREAKDOWN)
             + f"{'wait-data':>11}{'gen share':>11}"]
    for mode, run in result["runs"].items():
        per = run.get("mean_per_step_s", {})
        cells = "".join(f"{per[key]:>13.2f}" if key in per else f"{'-':>13}" for _, key in BREAKDOWN)
        wait = per.get(lm.TRAINER_WAIT)
        share = run.get("generation_share")
        tps = run.get("tokens_per_s")
        lines.append(f"{mode:<16}{(f'{tps:.1f}' if tps else 'failed'):>9}"
                     f"{per.get('timing_s/step', float('nan')):>8.2f}{cells}"
                     f"{(f'{wait:.2f}' if wait is not None else '-'):>11}{(f'{share:.2f}' if share is not None else '-'):>11}")
    lines.append("(seconds per step, steps 2..N; for an asynchronous trainer 'gen' is its wait for finished "
                 "trajectories)")
    lines.append("")
    for key, label in (("speedup", "sync"), ("speedup_vs_sync_bypass", "sync_bypass"),
                       ("speedup_vs_separate_async", "separate_async")):
        if result.get(key):
            lines.append(f"Laminar / {label}: {result[key]:.2f}x tokens/s")
    hist = result.get("staleness_hist") or {}
    if hist:
        lines.append("Staleness (trajectories trained k versions after they were generated): "
                     + ", ".join(f"{k}: {v}" for k, v in hist.items()))
    if result.get("checked_trajectories") is not None:
        lines.append(f"Trajectories checked for one weight version: {int(result['checked_trajectories'])}, mixed: "
                     f"{result.get('mixed_version_trajectories')}")
    lines.append("")
    lines.extend(f"picture: {p}" for p in pictures)
    lines.append(f"logs (verl and vLLM output): {', '.join(str(out / f'{m}.log') for m in result['runs'])}")
    return lines


def _console() -> logging.Logger:
    """The demo's own lines, bare, on stdout; everything else (this package's INFO logs) goes to demo.log."""
    con = logging.getLogger("verl_laminar.bench.demo.console")
    con.propagate = False
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    con.addHandler(handler)
    con.setLevel(logging.INFO)
    return con


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=None,
                    help="training steps per mode (the first is warm-up; default: the workload's)")
    ap.add_argument("--modes", default="sync,laminar")
    ap.add_argument("--workload", default="paper")
    ap.add_argument("--out", default=str(REPO / "runs" / "demo"))
    ap.add_argument("--results", default=None, help="also write the JSON and pictures there (docs/results)")
    ap.add_argument("--name", default="demo", help="result file name stem (a result file is never overwritten)")
    ns = ap.parse_args(argv)
    bench_argv = ["--modes", ns.modes, "--workload", ns.workload, "--out", ns.out, "--name", ns.name]
    bench_argv += (["--steps", str(ns.steps)] if ns.steps else []) + (["--results", ns.results] if ns.results else [])
    args = e2e.parse_args(bench_argv)
    exit_on_sigterm()  # a killed demo still ends the run it started
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, filename=str(out / "demo.log"),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    con = _console()
    eta = Eta(args.mode_list, args.steps)
    con.info("verl_laminar demo: %s, %d steps each, on %s (logs in %s)", " then ".join(args.mode_list), args.steps,
             args.workload.name, out)

    def progress(mode: str, event: str, d: dict) -> None:
        now = _mmss(eta.clock() - eta.t0)
        if event == "start":
            eta.start(mode)
            con.info("[%s] %-8s starting (Ray, vLLM engines, FSDP; about %s left in all)", now, mode,
                     _mmss(eta.remaining_s(mode)))
        elif event == "step":
            eta.step(mode, d["step"], d["t"])
            if not shown(d["step"], args.steps):
                return
            con.info("[%s] %-8s step %d/%d done  (about %s left)", now, mode, d["step"], args.steps,
                     _mmss(eta.remaining_s(mode)))
        elif event == "end":
            eta.end(mode)
            status = "done" if d["exit_code"] == 0 else f"FAILED (exit {d['exit_code']}; see {d['log']})"
            con.info("[%s] %-8s %s", now, mode, status)

    if args.model_is_fixture and not (Path(args.model) / "MANIFEST.json").exists():
        con.info("building the fixture %s first (once, a few minutes; then cached)", args.workload.fixture)
    # the provenance records the command as typed (the demo's own arguments), not the benchmark's expansion of it
    typed = sys.argv[1:] if argv is None else argv
    result, pictures = e2e.run(args, progress, typed, module="verl_laminar.bench.demo")
    con.info("")
    for line in summary_lines(result, pictures, out):
        con.info("%s", line)
    failed = [m for m, s in result["runs"].items() if s.get("exit_code") != 0 or "error" in s]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
