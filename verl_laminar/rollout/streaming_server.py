"""verl's vLLM server, streaming each Laminar request's tokens to the partial-response pool while it generates.

verl's ``vLLMHttpServer.generate`` answers only when a request ends, so a replica that dies mid-generation takes
its requests' tokens with it. Under ``+laminar=enabled`` with ``laminar.pool.enabled`` the replicas run this
subclass instead (``LaminarVLLMReplica.server_class``, chosen through verl's ``LLMServerManager.
rollout_replica_class`` seam by ``replica_class_for``):

    pinned client (rollout.pool_client)  generate with SamplingParams.extra_args[POOL_KEY_ARG] = the pool tag:
                                         the entry's key (the vLLM request id), group and pinned version
    this server's engine wrapper         opens the entry (prompt, the pin's version) as the request arrives, then
                                         every output's new tokens and log-probs go to the pool in chunks
                                         (pool.stream.PoolStreamer, laminar.pool.flush_*; all of the server's
                                         streams' chunks go as one pool call per laminar.pool.batch_tick_s,
                                         pool.batch.PoolBatcher), tagged with the version
                                         the server serves (the pool refuses a mismatch); the last chunk is awaited
                                         before verl's generate sees the end of the stream; the client closes the
                                         entry without waiting (one caller's calls to the pool run in order, and
                                         the server's are all applied by then)
    the replica dies                     the client reads the entry and continues the response on the group's
                                         new replica (same version) from its tokens so far

Only ``AsyncLLM.generate`` is wrapped (after verl's ``run_server`` builds the engine); every other attribute
is the engine's own, so aborts, weight loads and sleep/wake are verl's code unchanged. Requests without the
tag (verl's own, or Laminar's with the pool off) stream nothing.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from verl_laminar.platform.vllm_adapter import abort_takes_internal
from verl_laminar.pool.batch import PoolBatcher
from verl_laminar.pool.partial import ChunkPolicy
from verl_laminar.pool.stream import NO_LOGPROB, PoolStreamer

logger = logging.getLogger(__name__)

# SamplingParams.extra_args key naming the pool entry a request streams to (vLLM passes extra_args through)
POOL_KEY_ARG = "laminar_pool_key"
# a corrupted replica (fault injection) answers ids this far above the real ones: outside any vocabulary
GARBAGE_ID_OFFSET = 1 << 30


def pool_tag(sampling_params: Any) -> Optional[dict]:
    """The request's pool tag ({key, group, version}), or None: the request streams nothing."""
    extra = getattr(sampling_params, "extra_args", None) or {}
    tag = extra.get(POOL_KEY_ARG)
    return None if tag is None else dict(tag)


def where_of(tag: dict) -> Optional[dict]:
    """The entry's place in its group (session, turn, piece), which a restarted trainer adopts whole responses by
    (``policy.adopt``); None for a tag without it."""
    where = {k: int(tag[k]) for k in ("session", "turn", "piece") if tag.get(k) is not None}
    return where if len(where) == 3 else None


def _prompt_ids(args: tuple, kwargs: dict) -> list:
    prompt = kwargs.get("prompt", args[0] if args else None)
    ids = prompt.get("prompt_token_ids") if isinstance(prompt, dict) else getattr(prompt, "prompt_token_ids", None)
    return [int(t) for t in (ids or [])]


def _loggable(params: Any) -> dict:
    """What the pool logs of the request's sampling parameters (a resume takes its own from the client)."""
    return {k: getattr(params, k, None) for k in ("max_tokens", "temperature", "top_p", "top_k", "seed")}


def _new_log_probs(completion: Any, start: int, tokens: list) -> list:
    """Log-probs of ``tokens`` (the completion's tokens from ``start``), or placeholders when none were asked."""
    lps = getattr(completion, "logprobs", None)
    if not lps:
        return [NO_LOGPROB] * len(tokens)
    return [lps[start + i][t].logprob for i, t in enumerate(tokens)]


class StreamingEngine:
    """An ``AsyncLLM`` whose ``generate`` also streams tagged requests to the pool; everything else passes through.

    ``pool``: a callable returning the pool's shards (``pool.shards.PoolShards``, looked up on first use); ``version``: a callable
    returning the version the server serves now (verl's ``global_steps``).
    """

    def __init__(self, engine: Any, pool: Callable[[], Any], version: Callable[[], Any],
                 chunk: Optional[ChunkPolicy] = None, replica: Optional[int] = None) -> None:
        object.__setattr__(self, "_engine", engine)
        object.__setattr__(self, "_replica", replica)  # the router's replica id (verl's replica_rank)
        object.__setattr__(self, "_pool", pool)
        object.__setattr__(self, "_version", version)
        object.__setattr__(self, "_chunk", chunk or ChunkPolicy())
        object.__setattr__(self, "streamed_requests", 0)
        object.__setattr__(self, "_batchers", {})  # this process's PoolBatcher per shard, made on first use

    def batcher(self, pool: Any, shard: int = 0) -> Optional[PoolBatcher]:
        """The process's batcher for a shard (every stream's chunks to it in one call a tick), None with batch_tick_s
        null."""
        if self._chunk.batch_tick_s is None:
            return None
        if shard not in self._batchers:
            self._batchers[shard] = PoolBatcher(pool, self._chunk.batch_tick_s)
        return self._batchers[shard]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._engine, name, value)

    async def generate(self, *args: Any, **kwargs: Any):
        params = kwargs.get("sampling_params", args[1] if len(args) > 1 else None)
        tag = pool_tag(params)
        if tag is None:
            async for out in self._engine.generate(*args, **kwargs):
                yield out
            return
        key = str(tag["key"])
        version = self._version()
        if version is None:
            raise RuntimeError(f"request {key}: the server has no weight version yet (global_steps is None); a "
                               "Laminar request is sent only to a replica that loaded its version")
        shards = self._pool()
        shard = shards.index(tag["group"])  # the shard that owns the request's group (pool.shards)
        pool = shards.handles[shard]
        # not awaited: this server's chunks follow it in order (in the same batches, when it batches: one pool call
        # fewer per request); the entry carries the pin's version, the chunks the server's, so the pool refuses
        # tokens of a version the group was not pinned to
        batcher = self.batcher(pool, shard)
        open_args = (key, str(tag["group"]), int(tag["version"]), _prompt_ids(args, kwargs), _loggable(params),
                     self._replica, where_of(tag))
        opened = batcher.send("open", *open_args) if batcher is not None else pool.open.remote(*open_args)
        streamer = PoolStreamer(pool, key, int(version), 0, self._chunk, batcher=batcher)
        tokens: list = []
        log_probs: list = []
        delta = getattr(getattr(params, "output_kind", None), "name", "") == "DELTA"
        finished = False  # the engine ended the request itself (a stop token, its budget), not an abort
        async for out in self._engine.generate(*args, **kwargs):
            reason = getattr(out.outputs[0], "finish_reason", None) if out.outputs else None
            finished = reason is not None and reason != "abort"
            if out.outputs:
                c = out.outputs[0]
                new = list(c.token_ids) if delta else list(c.token_ids[len(tokens):])
                # a cumulative output's log-probs are cumulative too; a delta output's are the new ones
                log_probs.extend(_new_log_probs(c, 0 if delta else len(tokens), new))
                tokens.extend(new)
                streamer.maybe_flush(tokens, log_probs)
            yield out
        # finished: a replica that dies after this leaves a whole response, which the client must not extend
        await streamer.flush(tokens, log_probs, finished=finished)
        # and its entry exists before the client hears the answer and closes it: a request aborted before its first
        # token sends no chunk to wait for, and its open may still sit in the batcher's next tick
        try:
            await opened
        except Exception as e:  # noqa: BLE001 - the chunks' refusals raised above; a batched open's is logged
            if batcher is None:
                logger.error("the pool refused the open of %r: %s", key, e)
        object.__setattr__(self, "streamed_requests", self.streamed_requests + 1)


def corrupted(output: Any) -> Any:
    """verl's answer with every token id moved outside any vocabulary (fault injection only)."""
    output.token_ids = [GARBAGE_ID_OFFSET + int(t) for t in output.token_ids]
    return output


def streaming_server_class(chunk: Optional[ChunkPolicy] = None, pool_name: Optional[str] = None) -> type:
    """A subclass of verl's ``vLLMHttpServer`` whose engine is a ``StreamingEngine`` (not yet ``ray.remote``)."""
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer

    from verl_laminar.pool.actor import POOL_NAME

    name = pool_name or POOL_NAME
    policy = chunk or ChunkPolicy()

    class LaminarVLLMHttpServer(vLLMHttpServer):
        async def run_server(self, args: Any) -> None:
            from verl_laminar.platform.orphan_guard import watch

            # vLLM's engine processes outlive this actor when Ray kills it (platform.orphan_guard says why that
            # hangs the next run's weight sync on this host); the guard ends them after it
            self._laminar_guard = watch()
            await super().run_server(args)
            cache: dict = {}

            def pool() -> Any:
                if "pool" not in cache:
                    from verl_laminar.pool.shards import find_shards

                    cache["pool"] = find_shards(name)
                return cache["pool"]

            self.engine = StreamingEngine(self.engine, pool, lambda: self.global_steps, policy, int(self.replica_rank))
            logger.info("laminar: replica %s streams tagged requests to the partial-response pool %r",
                        self.replica_rank, name)

        async def abort_request(self, request_id: str, reset_prefix_cache: bool = True) -> dict:
            # verl 0.9.1 calls OutputProcessor.abort_requests([id]); newer vLLM also takes `internal`, and the
            # TypeError left the engine core decoding every repacked request to its end. vLLM's own abort
            # queues the final ABORT output (what ends the client's stream) and aborts in the engine core.
            if self.node_rank != 0 or not abort_takes_internal(self.engine.output_processor):
                return await super().abort_request(request_id, reset_prefix_cache)
            if request_id not in self.engine.output_processor.request_states:
                return {"aborted": False, "error": f"Request {request_id} not found"}
            await self.engine.abort(request_id, internal=True)
            if reset_prefix_cache:
                await self.clear_kv_cache()
            return {"aborted": True, "request_id": request_id}

        async def laminar_unfinished(self) -> int:
            """Requests the engine still holds: a restarted trainer waits for these to end before it ends a
            detached replica of its predecessor (``fleet.outlive``)."""
            return len(self.engine.output_processor.request_states)

        async def laminar_corrupt(self) -> None:
            """Fault injection (``laminar.fault_injection.replica_fault=garbage``): from now on every answer
            carries token ids outside the vocabulary, as a replica with corrupted weights or a broken kernel might."""
            self._laminar_corrupt = True
            logger.warning("laminar.fault_injection: replica %s now answers garbage token ids", self.replica_rank)

        async def generate(self, *args: Any, **kwargs: Any) -> Any:
            out = await super().generate(*args, **kwargs)
            return corrupted(out) if getattr(self, "_laminar_corrupt", False) else out

    return LaminarVLLMHttpServer


def replica_class_for(chunk: Optional[ChunkPolicy] = None, pool_name: Optional[str] = None,
                      detached: bool = False) -> type:
    """verl's ``vLLMReplica`` with the streaming server: what ``LLMServerManager.rollout_replica_class`` takes.
    ``detached`` (``laminar.fleet.detached``): its placement group, workers and server outlive the trainer
    (``fleet.outlive``)."""
    import ray
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMReplica

    from verl_laminar.fleet.outlive import detach_server_class, detached_standalone

    server = streaming_server_class(chunk, pool_name)

    class LaminarVLLMReplica(vLLMReplica):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.server_class = detach_server_class(ray.remote(server)) if detached else ray.remote(server)

        async def init_standalone(self) -> None:
            if detached:
                await detached_standalone(self)
            else:
                await super().init_standalone()

    return LaminarVLLMReplica
