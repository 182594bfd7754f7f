"""Partial-response pool: invariants, chunk policy, and recovery from its log after the pool process is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from verl_laminar.policy.accounting import InvariantViolation
from verl_laminar.pool.partial import ChunkPolicy, PartialPool

SP = {"temperature": 1.0, "max_tokens": 10}


def test_tokens_and_logprobs_accumulate_and_close_removes():
    pool = PartialPool()
    pool.open("u_0", "u", 3, [1, 2], SP, replica_id=0)
    pool.append("u_0", 3, [5, 6], [-0.1, -0.2])
    pool.append("u_0", 3, [7], [-0.3], state={"turn": 2})
    t = pool.get("u_0")
    assert (t.tokens, t.logprobs, t.state, t.remaining_budget()) == ([5, 6, 7], [-0.1, -0.2, -0.3], {"turn": 2}, 7)
    pool.reassign("u_0", 2)
    assert [x.key for x in pool.on_replica(2)] == ["u_0"] and pool.on_replica(0) == []
    pool.close("u_0")
    assert len(pool) == 0


@pytest.mark.parametrize("ops, error", [
    ([("open", "a", 1), ("append", "a", 2)], InvariantViolation),  # another version's tokens
    ([("open", "a", 1), ("open", "a", 1)], InvariantViolation),  # opened twice
    ([("append", "a", 1)], InvariantViolation),  # unknown
    ([("open", "a", 1), ("close", "a", 1), ("append", "a", 1)], InvariantViolation),  # closed
])
def test_invariant_violations_raise(ops, error):
    pool = PartialPool()
    with pytest.raises(error):
        for op, key, version in ops:
            if op == "open":
                pool.open(key, "g", version, [1], SP)
            elif op == "append":
                pool.append(key, version, [1], [-1.0])
            else:
                pool.close(key)


def test_unpaired_logprobs_are_rejected():
    pool = PartialPool()
    pool.open("a", "g", 0, [1], SP)
    with pytest.raises(ValueError, match="must pair up"):
        pool.append("a", 0, [1, 2], [-1.0])


def test_chunk_policy():
    p = ChunkPolicy(flush_tokens=64, flush_interval_s=1.0)
    assert not p.due(0, 9.0) and not p.due(10, 0.5) and p.due(64, 0.0) and p.due(1, 1.0)
    with pytest.raises(ValueError, match="flush_tokens"):
        ChunkPolicy(flush_tokens=0)


def test_reopened_pool_recovers_entries_and_skips_a_torn_last_record(tmp_path):
    path = str(tmp_path / "pool.log")
    pool = PartialPool(path)
    pool.open("a", "g", 4, [1, 2, 3], SP, replica_id=1)
    pool.append("a", 4, [9, 8], [-0.5, -0.25])
    pool.open("b", "g", 4, [1, 2, 3], SP, replica_id=1)
    pool.close("b")
    pool.shutdown()
    with open(path, "ab") as f:
        f.write(b'{"op":"append","key":"a","vers')  # the process died mid-write
    again = PartialPool(path)
    assert again.torn_records == 1 and again.recovered == 1
    t = again.get("a")
    assert (t.version, t.prompt_ids, t.tokens, t.logprobs, t.replica_id) == (4, [1, 2, 3], [9, 8], [-0.5, -0.25], 1)
    again.append("a", 4, [7], [-1.0])  # appends after recovery land after a clean record
    again.shutdown()
    assert PartialPool(path).get("a").tokens == [9, 8, 7]


def test_compaction_keeps_live_entries(tmp_path):
    path = str(tmp_path / "pool.log")
    pool = PartialPool(path, compact_ratio=1.0)
    for i in range(200):
        pool.open(f"k{i}", "g", 0, [1], SP)
        pool.append(f"k{i}", 0, [i], [-1.0])
        if i % 10:
            pool.close(f"k{i}")
    pool.shutdown()
    assert sum(1 for _ in open(path)) < 200  # compacted at least once
    assert sorted(t.key for t in PartialPool(path)) == sorted(f"k{i}" for i in range(0, 200, 10))


WRITER = """
import sys, time
from verl_laminar.pool.partial import PartialPool
pool = PartialPool(sys.argv[1])
pool.open("t", "g", 7, [1, 2], {"max_tokens": 100000})
i = 0
print("ready", flush=True)
while True:
    pool.append("t", 7, [i], [-float(i)])
    i += 1
"""


def test_pool_process_killed_mid_stream_loses_no_acknowledged_chunk(tmp_path):
    """A real process appends as fast as it can; SIGKILL; the recovered trajectory is a clean prefix."""
    path = str(tmp_path / "pool.log")
    proc = subprocess.Popen([sys.executable, "-c", WRITER, path], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(1.0)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    t = PartialPool(path).get("t")
    n = len(t.tokens)
    assert n > 100  # it was really streaming
    assert t.tokens == list(range(n)) and t.logprobs == [-float(i) for i in range(n)] and t.version == 7


def test_append_with_offset_is_idempotent_and_refuses_overlaps():
    from verl_laminar.pool.partial import PartialPool

    pool = PartialPool()
    pool.open("k", "g", 1, [1, 2], {"max_tokens": 8})
    assert pool.append("k", 1, [5, 6], [-0.5, -0.6], offset=0)
    assert not pool.append("k", 1, [5, 6], [-0.5, -0.6], offset=0)  # a retried chunk after a pool restart
    assert pool.append("k", 1, [7], [-0.7], offset=2)
    assert pool.get("k").tokens == [5, 6, 7]
    with pytest.raises(InvariantViolation, match="overlap"):
        pool.append("k", 1, [8, 9], [-0.8, -0.9], offset=2)
    assert pool.get_many(["k", "nope"])["nope"] is None


def test_a_chunk_resent_after_a_restart_may_land_after_the_next_one(tmp_path):
    """Seen in a chaos run: the pool died with chunk 52..81 unlogged; Ray resent it, but the sender's next
    chunk (81..) arrived first. The early chunk is logged and held; the entry stays contiguous; the resent
    chunk fills the gap and the held one follows. A restart in between keeps the held chunk."""
    from verl_laminar.pool.partial import PartialPool

    path = str(tmp_path / "pool.log")
    pool = PartialPool(path)
    pool.open("k", "g", 1, [1], {"max_tokens": 16})
    pool.append("k", 1, [0, 1], [-0.0, -0.1], offset=0)
    assert pool.append("k", 1, [4, 5], [-0.4, -0.5], offset=4)  # ahead of the missing 2..4
    assert not pool.append("k", 1, [4, 5], [-0.4, -0.5], offset=4)  # held already
    assert pool.get("k").tokens == [0, 1]  # a resume now continues from token 2, never skipping one
    pool.shutdown()
    pool = PartialPool(path)  # the pool restarts again before the gap is filled
    assert pool.get("k").tokens == [0, 1]
    assert pool.append("k", 1, [2, 3], [-0.2, -0.3], offset=2)
    assert pool.get("k").tokens == [0, 1, 2, 3, 4, 5]
    assert pool.get("k").logprobs == [-0.0, -0.1, -0.2, -0.3, -0.4, -0.5]
    pool.compact()
    pool.shutdown()
    assert PartialPool(path).get("k").tokens == [0, 1, 2, 3, 4, 5]
    # a truncate (garbage tail) drops held chunks too
    pool = PartialPool(path)
    pool.append("k", 1, [9], [-0.9], offset=8)
    pool.truncate("k", 6)
    pool.append("k", 1, [6, 7], [-0.6, -0.7], offset=6)
    assert pool.get("k").tokens == [0, 1, 2, 3, 4, 5, 6, 7]


def test_truncate_drops_a_bad_tail_and_survives_replay(tmp_path):
    from verl_laminar.pool.partial import PartialPool

    path = str(tmp_path / "pool.log")
    pool = PartialPool(path)
    pool.open("k", "g", 1, [1], {"max_tokens": 8})
    pool.append("k", 1, [5, 6, 1 << 30], [-0.5, -0.6, 0.0], offset=0)
    pool.truncate("k", 2)
    with pytest.raises(ValueError, match="holds 2"):
        pool.truncate("k", 3)
    pool.shutdown()
    again = PartialPool(path)
    assert again.get("k").tokens == [5, 6] and again.get("k").logprobs == [-0.5, -0.6]


def test_the_log_keeps_every_log_prob_exactly_and_reads_older_plain_logs(tmp_path):
    import json
    import math

    path = str(tmp_path / "pool.log")
    pool = PartialPool(path)
    pool.open("k", "g", 2, [1, 2], {"max_tokens": 8})
    lps = [-math.inf, -1e-300, -0.1 - 0.2, -123.456789012345678]
    pool.append("k", 2, [0, 151_643, 2**31 - 1, 5], lps, offset=0)
    with pytest.raises(ValueError, match="int32"):
        pool.append("k", 2, [2**31], [0.0], offset=4)
    assert len(pool.get("k").tokens) == 4  # refused before it touched the entry
    pool.shutdown()
    again = PartialPool(path)
    t = again.get("k")
    assert t.tokens == [0, 151_643, 2**31 - 1, 5] and t.logprobs == lps  # bit-exact, -inf included
    again.shutdown()
    # a log written before the records were packed (plain JSON lists) still replays
    old = tmp_path / "old.log"
    old.write_text(json.dumps({"op": "open", "key": "o", "group_id": "g", "version": 0, "prompt_ids": [1],
                               "sampling_params": {}, "replica_id": None, "state": {}}) + "\n"
                   + json.dumps({"op": "append", "key": "o", "version": 0, "tokens": [4, 5],
                                 "logprobs": [-0.5, -1.5], "state": None, "offset": 0}) + "\n")
    assert PartialPool(str(old)).get("o").tokens == [4, 5]
