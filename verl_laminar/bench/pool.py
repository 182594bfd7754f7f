"""Does one partial-response pool keep up with a fleet? The real pool (its actor, its client, its log) under the
streaming pattern of ``replicas`` x ``seqs`` running sequences.

    python -m verl_laminar.bench.pool --json                      # 64 x 128, 64-token chunks, 1 s flush, batched
    python -m verl_laminar.bench.pool --batch-tick-s 0 --json     # the same, one pool call per chunk
    python -m verl_laminar.bench.pool --replicas 4 --seqs 16 --duration-s 30 --json --results docs/results

Dataflow: ``--generators`` Ray actors each play some replicas (``bench.pool_load``: when each sequence's next chunk
is due, lengths drawn up to ``--max-tokens``) -> every sequence opens its entry, streams its tokens through
``pool.stream.PoolStreamer`` (what the rollouts use), and at its end flushes with ``finished`` and closes -> the
pool actor of ``pool.actor.spawn_pool`` writes each operation to its log in ``--log-dir`` (node-local by default).
Each chunk's send and acknowledgment times are recorded at the sender; the pool acknowledges after the record's
``write``, after which a reader sees it even if the pool's process dies, so the delay is an upper bound on
send-to-durable. Over the window after ``--warmup-s`` it reports ``offered_appends_per_s``,
``sustained_appends_per_s``, ``delay_p50_s`` / ``delay_p99_s``, ``open_entries``, ``compaction_s``,
``pool_rss_bytes`` and ``end_wait_p50_s`` / ``end_wait_p99_s`` (what a trajectory's end waits for its chunks).

The load generators share the machine with the pool: when they cannot send at the nominal rate, the offered rate
shows it (``nominal_appends_per_s`` beside it). The JSON opens with the provenance record (``bench.provenance``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import json
import logging
import math
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from array import array
from typing import Any, Optional

from verl_laminar.bench.pool_load import (
    Load,
    next_due,
    percentile,
    read_records,
    summarize,
    tokens_at,
    write_records,
)
from verl_laminar.bench.provenance import claim_result_path, provenance
from verl_laminar.pool.partial import ChunkPolicy
from verl_laminar.pool.stream import PoolStreamer

logger = logging.getLogger(__name__)

STATS_TIMEOUT_S = 300.0


# Distinct values for the synthetic responses, made once: a generator slices them instead of building numbers per
# chunk (it shares the cores with the pool). Ids above 256, as a real vocabulary's: Python caches small ints, so a
# repeated small id (7, as this benchmark once sent) costs the pool one pointer a token instead of an object.
_IDS = list(range(1000, 1000 + 2 * 16384))
_LOGPROBS = [-0.001 - (i % 4093) * 1e-3 for i in range(2 * 16384)]


class _Tokens:
    """A response's tokens (or log-probs) as the streamer sees them (``len`` and slices) without holding 16K values
    per sequence; a slice holds distinct values, as a real response's does."""

    def __init__(self, logprobs: bool = False) -> None:
        self.n, self.values = 0, _LOGPROBS if logprobs else _IDS

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, s: slice) -> list:
        start, stop, _ = s.indices(self.n)
        if stop - start > len(self.values):
            raise ValueError(f"a chunk of {stop - start} tokens is longer than the synthetic values ({len(self.values)})")
        base = start % (len(self.values) - (stop - start) + 1)
        return self.values[base:base + stop - start]


class _Sequence:
    def __init__(self, key: str, start: float, length: int, rate: float, streamer: Any) -> None:
        self.key, self.start, self.length, self.rate, self.streamer = key, start, length, rate, streamer
        self.tokens, self.logprobs = _Tokens(), _Tokens(logprobs=True)


class _TimedStreamer(PoolStreamer):
    """The rollouts' streamer, each chunk's send and acknowledgment times recorded by its generator."""

    def __init__(self, gen: "Generator", *args: Any) -> None:
        super().__init__(*args)
        self.gen = gen

    def _send(self, tokens: list, log_probs: list) -> Any:
        sent = time.monotonic()
        ref = super()._send(tokens, log_probs)
        self.gen._record_send(ref, sent)
        return ref


class Generator:
    """Plays some replicas of the fleet against the pool (a Ray async actor; its records go back to the driver)."""

    def __init__(self, pool_name: str, load: dict, replica_ids: list[int], seed: int, batch_tick_s: float = 0.0
                 ) -> None:
        from verl_laminar.pool.partial import ChunkPolicy
        from verl_laminar.pool.shards import find_shards

        self.shards = find_shards(pool_name)  # each sequence is its own group here: its key routes it
        self.batch_tick_s = batch_tick_s  # > 0: each replica sends its streams' writes in one call per tick per shard
        self.batchers: dict[tuple[int, int], Any] = {}
        self.load = Load(**load)
        self.replicas = replica_ids
        self.rng = random.Random(seed)
        self.policy = ChunkPolicy(self.load.flush_tokens, self.load.flush_interval_s)
        # per chunk its send and acknowledgment times (monotonic seconds; NaN: no answer yet), in arrays: a list a
        # chunk (10^5-10^6 of them) made this process's own garbage collection pause its acknowledgments
        self.sent, self.acked = array("d"), array("d")
        self.end_waits: list[tuple[float, float]] = []  # (when the end began, seconds it waited)
        self._finishing: set = set()

    def _record_send(self, ref: Any, sent: float) -> None:
        i = len(self.sent)
        self.sent.append(sent)
        self.acked.append(math.nan)
        future = ref if isinstance(ref, asyncio.Future) else ref.future()  # batched: the batcher's future
        future.add_done_callback(lambda _f: self.acked.__setitem__(i, time.monotonic()))

    def _open(self, replica: int, now: float) -> _Sequence:
        key = f"r{replica}-{uuid.uuid4().hex[:12]}"
        open_args = (key, key, 0, [1] * self.load.prompt_tokens, {"max_tokens": self.load.max_tokens}, replica)
        shard = self.shards.index(key)
        pool, batcher = self.shards.handles[shard], None
        if self.batch_tick_s > 0:  # as the rollouts' servers: the open goes in the batch its chunks follow
            from verl_laminar.pool.batch import PoolBatcher

            if (replica, shard) not in self.batchers:
                self.batchers[replica, shard] = PoolBatcher(pool, self.batch_tick_s)
            batcher = self.batchers[replica, shard]
            batcher.send("open", *open_args)
        else:
            pool.open.remote(*open_args)
        streamer = _TimedStreamer(self, pool, key, 0, 0, self.policy, time.monotonic, batcher)
        # a random phase, so the fleet's chunks are spread over the interval as a running fleet's are
        streamer.last = now - self.rng.random() * self.load.flush_interval_s
        return _Sequence(key, now, self.load.draw_length(self.rng), self.load.tokens_per_s, streamer)

    async def hold(self) -> int:
        """Open this generator's share of the held entries: finished responses waiting for their groups (each whole,
        in one write, before the measurement starts). Returns how many."""
        n = 0
        for replica in self.replicas:
            ops: dict[int, list] = {}
            for _ in range(self.load.held_on(replica)):
                key, length = f"h{replica}-{uuid.uuid4().hex[:12]}", self.load.draw_length(self.rng)
                toks, lps = _Tokens(), _Tokens(logprobs=True)
                toks.n = lps.n = length
                ops.setdefault(self.shards.index(key), []).extend([
                    ("open", (key, key, 0, [1] * self.load.prompt_tokens, {"max_tokens": self.load.max_tokens},
                              replica)),
                    ("append", (key, 0, toks[0:length], lps[0:length], None, 0)), ("finish", (key,))])
            for shard, mine in ops.items():
                for i in range(0, len(mine), 96):
                    answers = await self.shards.handles[shard].apply_many.remote(mine[i:i + 96])
                    refused = [r for r in answers if isinstance(r, Exception)]
                    if refused:
                        raise RuntimeError(f"the pool refused held entries of replica {replica}: {refused[:3]}")
                n += len(mine) // 3
        return n

    async def _end(self, seq: _Sequence) -> None:
        began = time.monotonic()
        await seq.streamer.flush(seq.tokens, seq.logprobs, finished=True)
        self.end_waits.append((began, time.monotonic() - began))
        self.shards.of(seq.key).close.remote(seq.key)

    async def run(self, start_at: float, duration_s: float) -> dict:
        await asyncio.sleep(max(0.0, start_at - time.monotonic()))
        now, load = time.monotonic(), self.load
        heap: list = []
        for replica in self.replicas:
            for _ in range(load.seqs):
                seq = self._open(replica, now - self.rng.random() * load.median_tokens / load.tokens_per_s)
                heapq.heappush(heap, (next_due(seq.start, seq.rate, seq.length, 0, seq.streamer.last, load),
                                      id(seq), seq, replica))
        end = start_at + duration_s
        while time.monotonic() < end:
            now = time.monotonic()
            while heap and heap[0][0] <= now:
                _, _, seq, replica = heapq.heappop(heap)
                seq.tokens.n = seq.logprobs.n = tokens_at(now, seq.start, seq.rate, seq.length)
                if seq.tokens.n >= seq.length:
                    task = asyncio.ensure_future(self._end(seq))
                    self._finishing.add(task)
                    task.add_done_callback(self._finishing.discard)
                    seq = self._open(replica, now)
                else:
                    seq.streamer.maybe_flush(seq.tokens, seq.logprobs)
                heapq.heappush(heap, (next_due(seq.start, seq.rate, seq.length, seq.streamer.sent,
                                               seq.streamer.last, load), id(seq), seq, replica))
            await asyncio.sleep(max(0.0, min(0.05, (heap[0][0] if heap else end) - time.monotonic())))
        return {"running": len(heap), "pool_calls": sum(b.calls for b in self.batchers.values())}

    async def run_to(self, start_at: float, duration_s: float, path: str) -> dict:
        """``run``, its records written to ``path`` (not returned through Ray: at 128 replicas a generator's 10^6
        rows as a Ray return ended in a ``DeserializationError`` that hid what happened); a failure comes back as
        its traceback, since the driver runs without the workers' logs."""
        try:
            out = await self.run(start_at, duration_s)
            write_records(path, (self.sent.tobytes(), self.acked.tobytes()), self.end_waits)
            return out
        except Exception:  # the driver raises it with the generator named
            import traceback

            return {"error": traceback.format_exc()}


def pool_busy(first: dict, last: dict) -> dict:
    """The pool process's CPU seconds between two ``stats`` answers, per second of wall time (1.0: one core busy)."""
    if last.get("cpu_s") is None or first.get("cpu_s") is None or last["at"] <= first["at"]:  # an answer missing
        return {"pool_cpu_s": None, "pool_busy_fraction": None}
    cpu = last["cpu_s"] - first["cpu_s"]
    return {"pool_cpu_s": cpu, "pool_busy_fraction": cpu / (last["at"] - first["at"])}


def pools_busy(first: list[dict], last: list[dict]) -> dict:
    """``pool_busy`` of each shard, and their sum (cores busy with the pool; None if a shard did not answer)."""
    each = [pool_busy(f, s)["pool_busy_fraction"] for f, s in zip(first, last)]
    cpu = [pool_busy(f, s)["pool_cpu_s"] for f, s in zip(first, last)]
    whole = None in each or not each
    return {"pool_cpu_s": None if whole else sum(cpu), "pool_busy_fraction": None if whole else sum(each),
            "shard_busy_fractions": each}


STAT_KEYS = ("open_entries", "compaction_s_max", "compaction_s_total", "compactions", "rss_bytes", "log_bytes",
             "cpu_s", "at")


def _stats(shards: Any, timeout_s: float = STATS_TIMEOUT_S) -> list[dict]:
    """Each shard's ``stats``; a shard that does not answer within the bound (still applying queued chunks) gives
    its keys as None."""
    import ray

    out = []
    for h in shards.handles:
        try:
            out.append(ray.get(h.stats.remote(), timeout=timeout_s))
        except ray.exceptions.GetTimeoutError:
            logger.warning("a pool shard did not answer its stats within %.0f s (still applying queued chunks)",
                           timeout_s)
            out.append(dict.fromkeys(STAT_KEYS))
    return out


def merged(stats: list[dict]) -> dict:
    """The shards' end-of-run stats as one pool's: counts and bytes added, the longest compaction."""
    def total(k: str) -> Optional[float]:
        vals = [x[k] for x in stats]
        return None if None in vals else sum(vals)

    longest = [x["compaction_s_max"] for x in stats]
    return {"open_entries": total("open_entries"), "compaction_s_max": None if None in longest else max(longest),
            "compaction_s_total": total("compaction_s_total"), "compactions": total("compactions"),
            "rss_bytes": total("rss_bytes"), "log_bytes": total("log_bytes")}


def run(load: Load, duration_s: float, warmup_s: float, generators: int, log_dir: Optional[str],
        seed: int = 0, batch_tick_s: float = 0.0, shards: int = 1) -> dict:
    """One measurement on a local Ray instance with ``shards`` pool actors; returns the result's keys (without
    provenance)."""
    import ray

    from verl_laminar.pool.shards import shard_log, spawn_shards

    if warmup_s >= duration_s:
        raise ValueError(f"--warmup-s {warmup_s} must be shorter than --duration-s {duration_s}")
    folder = tempfile.mkdtemp(prefix="laminar-pool-bench-", dir=log_dir)
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(num_cpus=max(2, generators + 1), include_dashboard=False, log_to_driver=False,
                 _node_ip_address="127.0.0.1", logging_level=logging.WARNING)
    name = f"laminar_pool_bench_{uuid.uuid4().hex[:8]}"
    try:
        pool = spawn_shards([shard_log(os.path.join(folder, "pool.log"), i) for i in range(shards)], base=name)
        _stats(pool)
        gens = [ray.remote(Generator).options(num_cpus=0).remote(name, load.to_dict(),
                                                               list(range(g, load.replicas, generators)), seed + g,
                                                               batch_tick_s)
                for g in range(generators)]
        ray.get([g.__ray_ready__.remote() for g in gens])
        held = sum(ray.get([g.hold.remote() for g in gens], timeout=1800))
        start_at = time.monotonic() + 1.0
        paths = [os.path.join(folder, f"generator{g}.bin") for g in range(generators)]
        refs = [g.run_to.remote(start_at, duration_s, p) for g, p in zip(gens, paths)]
        # the pool's CPU seconds from the window's start: how busy one pool process is at this rate (its answer
        # waits behind the chunks queued before it, so the span is measured between the two answers)
        time.sleep(max(0.0, start_at + warmup_s - time.monotonic()))
        first = _stats(pool)
        time.sleep(max(0.0, start_at + duration_s - time.monotonic()))
        second = _stats(pool)
        outs = ray.get(refs, timeout=duration_s + 600)
        for g, o in enumerate(outs):
            if "error" in o:
                raise RuntimeError(f"load generator {g} failed:\n{o['error']}")
            o.update(zip(("sends", "end_waits"), read_records(paths[g])))
        # queued behind every chunk still unapplied: a saturated pool answers late, or not within the bound
        stats = merged(_stats(pool))
        for h in pool.handles:
            ray.kill(h)
    finally:  # the records are read above, before the folder goes
        if started_ray:
            ray.shutdown()
        shutil.rmtree(folder, ignore_errors=True)
    window = (start_at + warmup_s, start_at + duration_s)
    sends = [s for o in outs for s in o["sends"]]
    waits = [w for o in outs for b, w in o["end_waits"] if window[0] <= b < window[1]]
    out = summarize(sends, window)
    out.update(nominal_appends_per_s=load.nominal_appends_per_s(), running_sequences=sum(o["running"] for o in outs),
               held_entries=held,
               open_entries=stats["open_entries"], compaction_s=stats["compaction_s_max"],
               compaction_s_total=stats["compaction_s_total"], compactions=stats["compactions"],
               pool_rss_bytes=stats["rss_bytes"], log_bytes_at_end=stats["log_bytes"],
               end_wait_p50_s=percentile(waits, 0.5), end_wait_p99_s=percentile(waits, 0.99), ends_in_window=len(waits),
               batch_tick_s=batch_tick_s, batched_calls=sum(o["pool_calls"] for o in outs), shards=shards,
               **pools_busy(first, second))
    return out


def parse_args(argv=None) -> argparse.Namespace:
    d = Load()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", type=int, default=d.replicas)
    ap.add_argument("--seqs", type=int, default=d.seqs, help="running sequences per replica")
    ap.add_argument("--flush-tokens", type=int, default=d.flush_tokens)
    ap.add_argument("--flush-interval-s", type=float, default=d.flush_interval_s)
    ap.add_argument("--tokens-per-s", type=float, default=d.tokens_per_s, help="decode rate of one sequence")
    ap.add_argument("--median-tokens", type=int, default=d.median_tokens)
    ap.add_argument("--max-tokens", type=int, default=d.max_tokens)
    ap.add_argument("--held-entries", type=int, default=None,
                    help="finished responses held open for their groups (default: one per running sequence)")
    ap.add_argument("--duration-s", type=float, default=60.0)
    ap.add_argument("--warmup-s", type=float, default=15.0)
    ap.add_argument("--generators", type=int, default=2, help="load-generating actors (they share the machine)")
    ap.add_argument("--batch-tick-s", type=float, default=ChunkPolicy().batch_tick_s,
                    help="each replica's chunks go to the pool in one call per tick (pool.batch), as the rollouts "
                         "send them (laminar.pool.batch_tick_s, default %(default)s); 0: one call per chunk")
    ap.add_argument("--shards", type=int, default=1, help="pool actors, each owning whole groups (pool.shards)")
    ap.add_argument("--log-dir", default=None, help="where the pool's log goes (default: this node's temp dir)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--results", default=None, metavar="DIR", help="also write the JSON to DIR/<name>_<date>.json")
    ap.add_argument("--results-name", default=None, help="file name stem (default bench_pool_<replicas>x<seqs>)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    return ap.parse_args(argv)


def setup(a: argparse.Namespace, argv: Any, module: str, stem: str) -> tuple[Load, dict, Any]:
    """The load of the flags, the provenance record (before the run: the load it started under), and the result file
    claimed (None without ``--results``; False, logged, when it exists)."""
    load = Load(replicas=a.replicas, seqs=a.seqs, flush_tokens=a.flush_tokens, flush_interval_s=a.flush_interval_s,
                tokens_per_s=a.tokens_per_s, median_tokens=a.median_tokens, max_tokens=a.max_tokens,
                held_entries=a.held_entries)
    prov = provenance(argv, module)
    if not a.results:
        return load, prov, None
    try:
        return load, prov, claim_result_path(a.results, a.results_name or f"{stem}_{a.replicas}x{a.seqs}", prov)
    except FileExistsError as e:
        logger.error("%s: %s", module, e)
        return load, prov, False


def main(argv=None) -> int:
    a = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    load, prov, saved = setup(a, argv, "verl_laminar.bench.pool", "bench_pool")
    if saved is False:
        return 2
    # Ray prints its warnings (tasks piling up before a saturated actor) to stdout: keep stdout for the JSON
    with contextlib.redirect_stdout(sys.stderr):
        measured = run(load, a.duration_s, a.warmup_s, a.generators, a.log_dir, a.seed, a.batch_tick_s, a.shards)
    result = {**prov, "load": load.to_dict(), "duration_s": a.duration_s, "warmup_s": a.warmup_s,
              "generators": a.generators, **measured}
    text = json.dumps(result, indent=2)
    if saved is not None:
        saved.write_text(text + "\n")
    if a.json:
        sys.stdout.write(text + "\n")
    else:
        logger.warning("pool: offered %.0f/s, sustained %.0f/s, delay p99 %s s, %s open entries",
                       result["offered_appends_per_s"], result["sustained_appends_per_s"], result["delay_p99_s"],
                       result["open_entries"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
