"""The sending side of the partial-response pool: a request's new tokens go to the pool in chunks while it runs.

Used by every rollout that streams to the pool: ``rollout.engine_replica.EngineReplica`` (its own vLLM engine)
and ``rollout.streaming_server`` (verl's vLLM server under ``+laminar=enabled``). Each chunk carries its offset,
so a chunk Ray resends after a pool restart is applied once (``PartialPool.append``). Chunks are not awaited as
they go (calls from one caller run in order on the pool actor); ``flush`` awaits every one, so a caller that
closes the entry afterwards never races its own data, and a chunk the pool refused (an invariant: tokens of
another version than the entry's) fails the request instead of vanishing.
"""

from __future__ import annotations

import math
import time
from typing import Any, Optional

from verl_laminar.pool.partial import ChunkPolicy

# the pool pairs every token with a log-prob; a request that asked for none stores this placeholder (the
# reader knows from the request whether its log-probs are real)
NO_LOGPROB = math.nan


class PoolStreamer:
    def __init__(self, pool: Any, key: str, version: int, offset: int = 0, chunk: Optional[ChunkPolicy] = None,
                 clock: Any = time.monotonic, batcher: Optional[Any] = None) -> None:
        self.pool, self.key, self.version, self.offset = pool, key, int(version), int(offset)
        self.batcher = batcher  # pool.batch.PoolBatcher of this process: chunks go in its next batch, not one call each
        self.policy = chunk or ChunkPolicy()
        self._clock = clock
        self.sent = 0  # tokens of this piece already sent
        self.last = clock()
        self.chunks = 0
        self._pending: list = []  # refs of the chunks sent and not yet awaited

    def _send(self, tokens: list, log_probs: list) -> Any:
        n = len(tokens)
        args = (self.key, self.version, tokens[self.sent:n], log_probs[self.sent:n], None, self.offset + self.sent)
        ref = self.batcher.submit("append", *args) if self.batcher is not None else self.pool.append.remote(*args)
        self.sent, self.last = n, self._clock()
        self.chunks += 1
        self._pending.append(ref)
        return ref

    def maybe_flush(self, tokens: list, log_probs: list) -> None:
        """Send what is new if the chunk policy says it is due (not awaited)."""
        if self.policy.due(len(tokens) - self.sent, self._clock() - self.last):
            self._send(tokens, log_probs)

    async def flush(self, tokens: list, log_probs: list, finished: bool = False) -> None:
        """Send the rest (then, with ``finished``, mark the entry as a whole response: after its last chunk, so
        the mark never covers a missing tail) and wait until the pool applied every call (a refusal raises)."""
        if len(tokens) > self.sent:
            self._send(tokens, log_probs)
        if finished:
            self._pending.append(self.batcher.submit("finish", self.key) if self.batcher is not None
                                 else self.pool.finish.remote(self.key))
        pending, self._pending = self._pending, []
        for ref in pending:
            await ref
