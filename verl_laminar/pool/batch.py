"""One call to the partial-response pool per tick for all the streams of a rollout process.

A replica runs ~128 sequences, each sending a chunk a second; one pool call per chunk makes the pool's per-call
cost the fleet's ceiling (64 replicas: ~8,000 calls a second on one actor). ``PoolBatcher`` collects the writes
of every ``PoolStreamer`` of its process and sends them as one ``PartialPool.apply_many`` call per ``tick_s``
(sooner when ``max_ops`` are waiting), which the pool applies in order and logs with one write.

Order: batches go one after the other (the next is sent once the previous answered), so a process's operations
reach the pool in the order they were submitted, and after any direct call the process made before them (Ray runs
one caller's calls to an actor in order). Each submission gets its own future: a refused operation fails only the
stream that sent it; a failed call (the pool died and Ray gave up) fails every operation of its batch.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Optional

logger = logging.getLogger(__name__)


class PoolBatcher:
    def __init__(self, pool: Any, tick_s: float = 0.05, max_ops: int = 4096) -> None:
        if tick_s <= 0 or max_ops < 1:
            raise ValueError(f"pool batch tick_s={tick_s} must be > 0 and max_ops={max_ops} >= 1")
        self.pool, self.tick_s, self.max_ops = pool, float(tick_s), int(max_ops)
        self._ops: list[tuple[str, tuple]] = []
        self._futures: list[asyncio.Future] = []
        self._task: Optional[asyncio.Task] = None
        self._full: Optional[asyncio.Event] = None
        self.calls = 0  # apply_many calls sent (each carried one batch)

    def submit(self, name: str, *args: Any) -> asyncio.Future:
        """Queue one pool operation (``PartialPool.apply_many``'s names); await the returned future for its result."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._ops.append((name, args))
        self._futures.append(future)
        if self._full is None:
            self._full = asyncio.Event()
        if len(self._ops) >= self.max_ops:
            self._full.set()
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._drain())
        return future

    async def _drain(self) -> None:
        while self._ops:
            try:
                await asyncio.wait_for(self._full.wait(), self.tick_s)
            except asyncio.TimeoutError:
                pass
            self._full.clear()
            ops, futures = self._ops[: self.max_ops], self._futures[: self.max_ops]
            del self._ops[: self.max_ops], self._futures[: self.max_ops]
            self.calls += 1
            try:
                results = await self.pool.apply_many.remote(ops)
            except Exception as e:  # noqa: BLE001 - the call's failure is each of its operations' failure
                for f in futures:
                    if not f.done():
                        f.set_exception(e)
                continue
            for f, r in zip(futures, results):
                if f.done():  # its awaiting stream was cancelled
                    continue
                if isinstance(r, BaseException):
                    f.set_exception(r)
                else:
                    f.set_result(r)

    def send(self, name: str, *args: Any) -> asyncio.Future:
        """``submit`` for an operation nobody awaits (a stream's ``open``: its chunks follow it in the same batches);
        a refusal is logged instead of left in a future nobody reads."""
        def log_refusal(f: asyncio.Future) -> None:
            if not f.cancelled() and f.exception() is not None:
                logger.error("the pool refused %s of %r: %s", name, args[0] if args else None, f.exception())

        future = self.submit(name, *args)
        future.add_done_callback(log_refusal)
        return future

    async def close(self) -> None:
        """Wait until every submitted operation was answered."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)
