"""Batched writes to the partial-response pool: ``PartialPool.apply_many`` (in order, one log write, a refusal
fails only its own operation, compaction inside a batch) and ``PoolBatcher`` under several ``PoolStreamer``s."""

import asyncio
import os

import pytest

from verl_laminar.policy.accounting import InvariantViolation
from verl_laminar.pool.batch import PoolBatcher
from verl_laminar.pool.partial import FINISHED, ChunkPolicy, PartialPool
from verl_laminar.pool.stream import PoolStreamer


class _Method:
    """``handle.method.remote(...)`` of an in-process pool: an awaitable answered on the next loop turn."""

    def __init__(self, fn, calls):
        self.fn, self.calls = fn, calls

    def remote(self, *args):
        self.calls.append(self.fn.__name__)
        future = asyncio.get_running_loop().create_future()
        try:
            future.set_result(self.fn(*args))
        except Exception as e:  # noqa: BLE001 - the remote error, as Ray would raise it at the await
            future.set_exception(e)
        return future


class Handle:
    def __init__(self, pool):
        self.calls = []
        for name in ("apply_many", "append", "finish", "open", "close"):
            setattr(self, name, _Method(getattr(pool, name), self.calls))


def _count_writes(monkeypatch):
    writes = []
    real = os.write

    def counting(fd, data):
        writes.append(len(data))
        return real(fd, data)

    monkeypatch.setattr(os, "write", counting)
    return writes


def test_apply_many_applies_in_order_with_one_write(tmp_path, monkeypatch):
    log = str(tmp_path / "pool.log")
    pool = PartialPool(log)
    writes = _count_writes(monkeypatch)
    out = pool.apply_many([("open", ("a", "g", 3, [1, 2], {})), ("append", ("a", 3, [5, 6], [-0.1, -0.2], None, 0)),
                           ("append", ("a", 4, [7], [-0.3], None, 2)),  # another version: refused alone
                           ("append", ("a", 3, [7], [-0.3], None, 2)), ("finish", ("a",)),
                           ("get", ("a",))])  # not a write: refused alone
    assert len(writes) == 1
    assert out[0] is None and out[1] is True and out[3] is True and out[4] is None
    assert isinstance(out[2], InvariantViolation) and isinstance(out[5], ValueError)
    t = pool.get("a")
    assert t.tokens == [5, 6, 7] and t.state[FINISHED]
    pool.shutdown()
    again = PartialPool(log)  # the one write holds every applied operation
    assert again.get("a").tokens == [5, 6, 7] and again.get("a").state[FINISHED]
    again.shutdown()


def test_a_compaction_inside_a_batch_does_not_log_its_operations_twice(tmp_path):
    log = str(tmp_path / "pool.log")
    pool = PartialPool(log, compact_ratio=1.0)
    ops = []
    for i in range(120):
        ops += [("open", (f"k{i}", f"g{i}", 0, [1], {})), ("append", (f"k{i}", 0, [i, i], [-1.0, -1.0], None, 0))]
        if i % 2:
            ops.append(("close", (f"k{i}",)))  # closes dominate the log: it is compacted inside this batch
    assert not any(isinstance(r, Exception) for r in pool.apply_many(ops))
    assert pool.stats()["compactions"] >= 1
    want = {t.key: t.tokens for t in pool}
    pool.shutdown()
    again = PartialPool(log)  # a record written twice would open an entry twice or double its tokens
    assert {t.key: t.tokens for t in again} == want and len(want) == 60
    again.shutdown()


def test_streams_of_a_process_share_a_few_calls(tmp_path):
    pool = PartialPool(str(tmp_path / "pool.log"))
    handle = Handle(pool)

    async def main():
        batcher = PoolBatcher(handle, tick_s=0.01)
        streams = []
        for i in range(10):
            pool.open(f"s{i}", f"g{i}", 1, [1], {})
            streams.append(PoolStreamer(handle, f"s{i}", 1, chunk=ChunkPolicy(flush_tokens=2), batcher=batcher))
        tokens = list(range(8))
        for n in range(2, 9, 2):  # four chunks per stream, every stream between two ticks
            for s in streams:
                s.maybe_flush(tokens[:n], [-0.5] * n)
            await asyncio.sleep(0)
        await asyncio.gather(*(s.flush(tokens, [-0.5] * 8, finished=True) for s in streams))
        return batcher

    batcher = asyncio.run(main())
    for i in range(10):
        t = pool.get(f"s{i}")
        assert t.tokens == list(range(8)) and t.state[FINISHED]
    ops = 10 * 4 + 10  # chunks and finishes
    assert handle.calls == ["apply_many"] * batcher.calls and 1 <= batcher.calls <= ops // 10
    pool.shutdown()


def test_a_refused_chunk_fails_only_its_own_stream(tmp_path):
    pool = PartialPool(str(tmp_path / "pool.log"))
    handle = Handle(pool)
    pool.open("good", "g", 1, [1], {})
    pool.open("bad", "h", 1, [1], {})

    async def main():
        batcher = PoolBatcher(handle, tick_s=0.01)
        good = PoolStreamer(handle, "good", 1, batcher=batcher)
        bad = PoolStreamer(handle, "bad", 2, batcher=batcher)  # tokens of another version than its entry's
        return await asyncio.gather(good.flush([4, 5], [-1.0, -1.0]), bad.flush([4], [-1.0]),
                                    return_exceptions=True)

    ok, refused = asyncio.run(main())
    assert ok is None and isinstance(refused, InvariantViolation)
    assert pool.get("good").tokens == [4, 5] and pool.get("bad").tokens == []
    pool.shutdown()


def test_batcher_rejects_nonsense_settings():
    with pytest.raises(ValueError):
        PoolBatcher(object(), tick_s=0)
    with pytest.raises(ValueError):
        PoolBatcher(object(), max_ops=0)


def test_an_open_sent_through_the_batcher_rides_the_batch_of_its_chunks_and_a_refusal_is_logged(tmp_path, caplog):
    pool = PartialPool(str(tmp_path / "pool.log"))
    handle = Handle(pool)

    async def main():
        batcher = PoolBatcher(handle, tick_s=0.01)
        batcher.send("open", "a", "g", 0, [1], {}, 0)
        done = batcher.submit("append", "a", 0, [5, 6], [-0.1, -0.2], None, 0)
        batcher.send("open", "a", "g", 0, [1], {}, 0)  # twice: refused, logged, nothing raised
        assert await done is True
        await batcher.close()

    with caplog.at_level("ERROR", logger="verl_laminar.pool.batch"):
        asyncio.run(main())
    assert handle.calls == ["apply_many"]  # the open, its chunk and the refused open: one call
    assert pool.get("a").tokens == [5, 6]
    assert "refused open of 'a'" in caplog.text and "opened twice" in caplog.text
