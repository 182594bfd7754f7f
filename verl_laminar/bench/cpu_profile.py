"""Micro benchmarks of this machine kind, the inputs of the simulator's ``cpu`` profile (``sim.cpu``).

    python -m verl_laminar.bench.cpu_profile --json [--results docs/results] [--window-s 12]

Everything runs on the fixture model with the settings of the CPU recipes (vLLM bf16, eager, a 256 MiB KV
cache, 32 sequences; the trainer in fp32 with bf16 autocast, one thread per rank, as Ray gives a verl
worker that asks for no CPUs). One process tree, measured in phases separated by barriers, each phase a
fixed window in which the named workers loop and the others sleep:

- ``engine``: engine 0 alone -- decode step time vs batch (1, 2, 4, 8 sequences) at two context lengths,
  prefill time per prompt token, and the time to load a full weight set through ``collective_rpc``;
- ``decode_1`` / ``decode_2`` / ``decode_4`` / ``train_1_decode_*``: the same decode loop (batch 4) on engine
  0 alone, beside engine 1, beside engines 1-3, and beside one trainer rank (and engine 1): the co-run
  slowdowns of a decode step;
- ``train_1`` / ``train_1_decode_1`` / ``train_1_decode_2``: one trainer rank's update (forward, backward,
  AdamW) alone, beside one and beside two decoding engines; ``train_2``: two ranks over gloo (gradients
  all-reduced, as FSDP reduce-scatters them), alone; ``fwd_1`` / ``fwd_2``: the forward-only log-prob pass;
- ``*_long``: the same four solo windows on sequences of ``LONG_SEQ_TOKENS``. verl's trainer on CPU computes over
  padded sequences (its agent loop pads every prompt and response to their maximum lengths, and the CPU config
  turns remove-padding off: no flash-attn), so a step's cost is that of its sequences at the padded length, where
  attention makes a token dearer than at 512; the simulator interpolates the cost per token between the two.

Nothing here is fitted to an end-to-end run: the simulator predicts the end-to-end benchmarks from these.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

from verl_laminar.bench.cpu_profile_plan import (  # noqa: F401 - PHASES, schedule, summarize: this module's API too
    CORUN_BATCH,
    DECODE_BATCHES,
    ENGINE_KV_BYTES,
    ENGINE_MAX_SEQS,
    FWD_PHASES,
    LONG_PROMPT,
    LONG_SEQ_TOKENS,
    MIN_UPDATES,
    PHASES,
    TRAIN_MICRO,
    TRAIN_SEQ_TOKENS,
    TRAIN_SEQS,
    TWO_RANK_PHASES,
    schedule,
    summarize,
)
from verl_laminar.bench.provenance import claim_result_path, provenance
from verl_laminar.bench.tree import FAILED
from verl_laminar.bench.tree import reporting as _reporting
from verl_laminar.platform.procs import exit_on_sigterm

logger = logging.getLogger("verl_laminar.bench.cpu_profile")


def _prompt(n: int) -> dict:
    # any token ids do (the engine does not read them), as long as every fixture's vocabulary has them: the
    # tiny-bpe fixture has 512 tokens, so no id of Qwen's special tokens
    return {"prompt_token_ids": [1, 2, 3] + [16] * max(0, n - 3)}


def _engine_profile(llm: Any, model_dir: str, repeats: int) -> dict:
    """Decode step vs batch and context, prefill per token, weight-load time (engine alone)."""
    from vllm import SamplingParams

    def run(b: int, prompt: int, n: int) -> float:
        sp = SamplingParams(temperature=1.0, max_tokens=n, min_tokens=n, ignore_eos=True)
        t0 = time.perf_counter()
        llm.generate([_prompt(prompt)] * b, sp, use_tqdm=False)
        return time.perf_counter() - t0

    def median(xs: list[float]) -> float:
        xs = sorted(xs)
        return xs[len(xs) // 2]

    short, long_ = 16, 80
    decode: dict[str, dict[str, float]] = {}
    for prompt in (16, LONG_PROMPT):
        row = {}
        for b in DECODE_BATCHES:
            row[str(b)] = median([(run(b, prompt, long_) - run(b, prompt, short)) / (long_ - short)
                                  for _ in range(repeats)])
        # the context during the measured steps: prompt plus the tokens generated so far (midpoint)
        decode[str(prompt + (short + long_) // 2)] = row
        logger.info("decode step at context %d: %s", prompt, {k: round(v * 1e3, 2) for k, v in row.items()})
    prefill = {}
    for b in (1, 4):
        t_long = median([run(b, LONG_PROMPT, 1) for _ in range(repeats)])
        t_short = median([run(b, 16, 1) for _ in range(repeats)])
        prefill[str(b)] = (t_long - t_short) / ((LONG_PROMPT - 16) * b)
    logger.info("prefill per token: %s", prefill)
    from verl_laminar.bench.repack import version_blobs
    from verl_laminar.rollout.engine_replica import _load_blob

    blob = version_blobs(model_dir, 2)[1]
    loads = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        llm.collective_rpc(_load_blob, args=(blob,))
        loads.append(time.perf_counter() - t0)
    logger.info("weight load: %.3f s for %d bytes", median(loads), len(blob))
    return {"decode_step_s": decode, "prefill_s_per_token": prefill, "weight_load_s": median(loads),
            "weight_bytes": len(blob)}


def _lead(members: tuple[str, ...]) -> str:
    """The worker that ends a phase: its trainer if it has one (an update is the longest unit), else e0."""
    return next((m for m in members if m.startswith("t")), members[0])


def _decode_loop(llm: Any, window_s: float, stop: Any, lead: bool) -> dict:
    """Batches of CORUN_BATCH sequences, 64 tokens each, until the phase ends: seconds per decode step.

    The lead ends the phase after ``window_s``; the others loop until it does, so co-runners overlap for
    the whole of every measured window."""
    from vllm import SamplingParams

    sp = SamplingParams(temperature=1.0, max_tokens=64, min_tokens=64, ignore_eos=True)
    steps, t0 = 0, time.perf_counter()
    while (time.perf_counter() - t0 < window_s) if lead else not stop.is_set():
        llm.generate([_prompt(16)] * CORUN_BATCH, sp, use_tqdm=False)
        steps += 64
    if lead:
        stop.set()
    return {"step_s": (time.perf_counter() - t0) / max(steps, 1), "steps": steps}


def _quiet_stdout() -> None:
    """vLLM logs to stdout; the parent's stdout carries the JSON, so a worker's goes to stderr. A process
    group of its own, so the parent can end the engine-core processes vLLM starts beneath it."""
    os.dup2(2, 1)
    os.setpgid(0, 0)


def _engine_worker(name: str, model_dir: str, window_s: float, repeats: int, barrier: Any, out: Any,
                   stops: dict, rounds: int) -> None:
    _quiet_stdout()
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc sends a function
    os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override kv_cache_memory_bytes
    from vllm import LLM

    llm = LLM(model_dir, dtype="bfloat16", enforce_eager=True, max_model_len=2048, max_num_seqs=ENGINE_MAX_SEQS,
              kv_cache_memory_bytes=ENGINE_KV_BYTES, seed=0)
    _decode_loop(llm, 1.0, threading.Event(), lead=True)  # warm-up: the lead ends by its window alone
    for label, phase, members in schedule(rounds):
        barrier.wait()
        if name not in members:
            continue
        if phase == "engine":
            out.put((label, name, _engine_profile(llm, model_dir, repeats)))
        else:
            out.put((label, name, _decode_loop(llm, window_s, stops[label], _lead(members) == name)))
    barrier.wait()
    # vLLM's shutdown at interpreter exit can hang on its engine core; the results are out once the queue's
    # feeder has flushed, so end this worker's whole process group (it and the engine core beneath it)
    out.close()
    out.join_thread()
    os.killpg(os.getpgid(0), signal.SIGKILL)


def _train_worker(name: str, rank: int, model_dir: str, window_s: float, port: int, barrier: Any, out: Any,
                  stops: dict, rounds: int) -> None:
    _quiet_stdout()
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)  # Ray sets OMP_NUM_THREADS=1 for a worker that asks for no CPUs
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    g = torch.Generator().manual_seed(rank)
    ids = torch.randint(0, model.config.vocab_size, (TRAIN_SEQS, TRAIN_SEQ_TOKENS), generator=g)
    long_ids = torch.randint(0, model.config.vocab_size, (TRAIN_SEQS, LONG_SEQ_TOKENS), generator=g)

    def update(world: int, backward: bool, seqs: Any = ids) -> int:
        mine = seqs[rank::world] if world > 1 else seqs
        for i in range(0, len(mine), TRAIN_MICRO):
            mb = mine[i:i + TRAIN_MICRO]
            with torch.autocast("cpu", dtype=torch.bfloat16), torch.set_grad_enabled(backward):
                logits = model(input_ids=mb).logits
                logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, mb.unsqueeze(-1)).mean()
            if backward:
                (-logp).backward()
        if backward:
            if world > 1:  # one flat bucket, as DDP / FSDP reduce gradients (per-tensor calls cost far more)
                grads = [p.grad for p in model.parameters() if p.grad is not None]
                flat = torch.cat([g.reshape(-1) for g in grads])
                dist.all_reduce(flat)
                offset = 0
                for g in grads:
                    g.copy_(flat[offset:offset + g.numel()].view_as(g))
                    offset += g.numel()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return mine.numel() * world  # tokens of the whole step

    update(1, True)  # warm-up
    for label, phase, members in schedule(rounds):
        barrier.wait()
        if name not in members:
            continue
        world = 2 if phase in TWO_RANK_PHASES else 1
        backward = phase not in FWD_PHASES
        seqs = long_ids if phase.endswith("_long") else ids
        lead = _lead(members) == name
        tokens, n, t0, per = 0, 0, time.perf_counter(), []
        # at least MIN_UPDATES updates: one update is ~10 s here, and one alone was seen to vary 2x
        def more() -> bool:
            if world > 1:  # both ranks meet in every all-reduce: the same fixed number of updates
                return n < MIN_UPDATES
            return (time.perf_counter() - t0 < window_s or n < MIN_UPDATES) if lead else not stops[label].is_set()

        while more():
            a = time.perf_counter()
            k = update(world, backward, seqs)
            per.append((time.perf_counter() - a) / k)
            tokens += k
            n += 1
        if lead:
            stops[label].set()
        per.sort()
        out.put((label, name, {"s_per_token": per[len(per) // 2], "updates": n, "tokens_per_update": tokens / n,
                               "s_per_token_each": per}))
    barrier.wait()
    dist.destroy_process_group()


def measure(model_dir: str, window_s: float, repeats: int, timeout_s: float, rounds: int = 2) -> dict:
    ctx = mp.get_context("spawn")
    engines = ("e0", "e1", "e2", "e3")
    barrier, out = ctx.Barrier(len(engines) + 2, timeout=timeout_s), ctx.Queue()
    import socket

    with socket.socket() as s:  # a free loopback port for gloo's rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    plan = schedule(rounds)
    stops = {label: ctx.Event() for label, _, _ in plan}  # set by a phase's lead when its window is over
    procs = [ctx.Process(target=_reporting, args=(_engine_worker, out, n, model_dir, window_s, repeats, barrier,
                                                   out, stops, rounds), name=n) for n in engines]
    procs += [ctx.Process(target=_reporting, args=(_train_worker, out, n, r, model_dir, window_s, port, barrier,
                                                    out, stops, rounds), name=n) for r, n in enumerate(("t0", "t1"))]
    for p in procs:
        p.start()
    results: dict[str, dict[str, Any]] = {}
    expected = sum(len(m) for _, _, m in plan)
    try:
        deadline = time.monotonic() + timeout_s + window_s * len(plan) * 4
        while sum(len(v) for v in results.values()) < expected:
            if time.monotonic() > deadline:
                raise TimeoutError(f"cpu profile: {results.keys()} after {timeout_s:.0f} s; a worker is stuck")
            if not all(p.is_alive() for p in procs) and out.empty():
                dead = [p.name for p in procs if not p.is_alive()]
                raise RuntimeError(f"cpu profile worker(s) {dead} exited early (exit codes "
                                   f"{[p.exitcode for p in procs if not p.is_alive()]}); see the log above")
            try:
                phase, name, rec = out.get(timeout=5.0)
            except Exception:  # queue.Empty: poll the workers again
                continue
            if phase == FAILED:
                raise RuntimeError(f"cpu profile worker {name} failed; the others would wait at the next phase's "
                                   f"barrier until --timeout-s:\n{rec}")
            results.setdefault(phase, {})[name] = rec
            logger.info("%s %s: %s", phase, name, rec if phase != "engine" else "done")
    finally:
        end = time.monotonic() + 30.0
        for p in procs:
            p.join(timeout=max(0.1, end - time.monotonic()))
        for p in procs:  # the worker and whatever it started (vLLM's engine core outlives a killed LLM)
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    return results


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m verl_laminar.bench.cpu_profile", description=__doc__.split("\n")[0])
    ap.add_argument("--window-s", type=float, default=12.0, help="seconds each co-run phase measures")
    ap.add_argument("--repeats", type=int, default=3, help="repeats of each engine micro benchmark (median)")
    ap.add_argument("--rounds", type=int, default=3, help="times the co-run phases are repeated (medians)")
    ap.add_argument("--timeout-s", type=float, default=600.0, help="the most any phase barrier waits")
    ap.add_argument("--fixture", default="tiny-qwen", help="which fixture to profile (recorded; sim --validate pairs "
                    "a profile with the benchmark run on the same fixture)")
    ap.add_argument("--model", default=None, help="a model directory instead of a fixture (recorded as fixture null)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--results", default=None, metavar="DIR", help="write DIR/<results-name>_<date>.json")
    ap.add_argument("--results-name", default="cpu_profile")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    prov = provenance(argv, "verl_laminar.bench.cpu_profile")
    path = None
    if args.results:
        try:
            path = claim_result_path(args.results, args.results_name, prov)
        except FileExistsError as e:
            ap.error(str(e))
    from verl_laminar.fixtures import UnknownFixtureError, model_dir

    try:
        fixture = None if args.model else model_dir(name=args.fixture).name
    except UnknownFixtureError as e:
        ap.error(str(e))
    args.model = args.model or str(model_dir(name=args.fixture))
    t0 = time.perf_counter()
    exit_on_sigterm()  # a killed profile still ends its workers and their vLLM engines (measure's finally)
    raw = measure(args.model, args.window_s, args.repeats, args.timeout_s, args.rounds)
    config = json.loads((Path(args.model) / "config.json").read_text())
    facts = {k: config.get(k) for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_key_value_heads")}
    record = {**prov, "fixture": fixture, "model": facts, "profile": summarize(raw), "raw": raw,
              "runtime_s": round(time.perf_counter() - t0, 1)}
    if path is not None:
        path.write_text(json.dumps(record, indent=1) + "\n")
        logger.info("wrote %s", path)
    if args.json:
        sys.stdout.write(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
