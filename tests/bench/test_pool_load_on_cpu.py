"""The pool benchmark's load model and summary (pure), and the pool's own stats it reports."""

import random

import pytest

from verl_laminar.bench.pool import _Tokens
from verl_laminar.bench.pool_load import Load, next_due, percentile, summarize, tokens_at
from verl_laminar.pool.partial import PartialPool


def test_the_issue_default_offers_about_8000_appends_a_second():
    load = Load()
    assert load.running == 64 * 128
    assert load.chunk_period_s() == 1.0  # 40 tokens/s never fill a 64-token chunk within the 1 s interval
    assert load.nominal_appends_per_s() == pytest.approx(8192)
    fast = Load(tokens_per_s=128.0)  # a chunk fills in 0.5 s: the token rule sets the pace
    assert fast.chunk_period_s() == 0.5 and fast.nominal_appends_per_s() == pytest.approx(16384)


def test_lengths_are_cut_at_max_tokens_and_spread():
    load = Load(median_tokens=2048, sigma=1.0, max_tokens=16384)
    rng = random.Random(0)
    lengths = [load.draw_length(rng) for _ in range(5000)]
    assert max(lengths) == 16384 and min(lengths) >= 1
    assert 1700 < sorted(lengths)[2500] < 2400  # the median holds
    assert Load(sigma=0.0, median_tokens=300).draw_length(rng) == 300


@pytest.mark.parametrize("bad", [dict(replicas=0), dict(tokens_per_s=0.0), dict(flush_interval_s=0.0),
                                 dict(sigma=-1.0)])
def test_invalid_loads_are_refused(bad):
    with pytest.raises(ValueError):
        Load(**bad)


def test_next_due_follows_the_chunk_policy():
    load = Load(flush_tokens=64, flush_interval_s=1.0)
    # 128 tokens/s: the chunk fills after 0.5 s, before the interval
    assert next_due(0.0, 128.0, 10_000, 0, 0.0, load) == pytest.approx(0.5)
    # 10 tokens/s: the interval rules (1 s after the last send)
    assert next_due(0.0, 10.0, 10_000, 20, 1.5, load) == pytest.approx(2.5)
    # the interval does not fire before a new token exists
    assert next_due(0.0, 0.5, 10_000, 1, 0.0, load) == pytest.approx(4.0)
    # the end comes first
    assert next_due(0.0, 10.0, 5, 0, 0.0, load) == pytest.approx(0.5)
    assert tokens_at(2.0, 0.0, 10.0, 15) == 15 and tokens_at(1.05, 0.0, 10.0, 100) == 10


def test_summary_counts_only_the_window_and_ranks_delays():
    sends = [(0.5, 0.6)]  # warm-up: left out
    sends += [(1.0 + i * 0.01, 1.0 + i * 0.01 + 0.015) for i in range(100)]  # 100 chunks in [1, 2), 15 ms each
    sends += [(1.9, None)]  # never answered: counted as lasting to the window's end
    out = summarize(sends, (1.0, 2.0))
    assert out["offered_appends_per_s"] == pytest.approx(101)
    assert out["sustained_appends_per_s"] == pytest.approx(99)  # the last acknowledgment lands after the window
    assert out["delay_p50_s"] == pytest.approx(0.015)
    assert out["delay_max_s"] == pytest.approx(0.1) and out["unanswered_in_window"] == 1
    with pytest.raises(ValueError):
        summarize(sends, (2.0, 2.0))
    assert percentile([], 0.5) is None and percentile([3.0, 1.0, 2.0], 0.99) == 3.0


def test_synthetic_tokens_slice_like_a_list_of_distinct_values():
    t, lp = _Tokens(), _Tokens(logprobs=True)
    t.n = lp.n = 5
    assert len(t) == 5 and t[2:5] == [1002, 1003, 1004] and t[5:5] == []
    # distinct objects, as a real response's values: one repeated object would pickle as references to it
    assert len({id(x) for x in t[0:5]}) == 5 and len({id(x) for x in lp[0:5]}) == 5
    assert all(x < 0 for x in lp[0:5])


def test_held_entries_default_to_one_per_running_sequence_spread_over_replicas():
    assert Load(replicas=4, seqs=3).held == 12
    load = Load(replicas=4, seqs=3, held_entries=6)
    assert [load.held_on(r) for r in range(4)] == [2, 2, 1, 1]
    with pytest.raises(ValueError, match="held_entries"):
        Load(held_entries=-1)


def test_pool_stats_time_its_compactions(tmp_path):
    pool = PartialPool(str(tmp_path / "pool.log"), compact_ratio=1.0)
    for i in range(80):
        pool.open(f"k{i}", f"g{i}", 0, [1, 2], {})
        pool.append(f"k{i}", 0, [5] * 8, [-0.1] * 8, offset=0)
        pool.close(f"k{i}")
    s = pool.stats()
    assert s["open_entries"] == 0 and s["compactions"] >= 1
    assert s["compaction_s_max"] > 0 and s["compaction_s_total"] >= s["compaction_s_max"]
    assert s["rss_bytes"] > 10 * 2**20 and s["log_bytes"] >= 0
    pool.shutdown()


def test_sends_pack_as_two_flat_buffers_and_come_back_equal():
    from verl_laminar.bench.pool_load import pack_sends, unpack_sends

    rows = [(1.5, 1.75), (2.0, None), (3.25, 4.0)]
    sent, acked = pack_sends(rows)
    assert isinstance(sent, bytes) and len(sent) == len(acked) == 3 * 8
    assert unpack_sends(sent, acked) == rows
    assert unpack_sends(*pack_sends([])) == []
    with pytest.raises(ValueError, match="2 send times against 3"):
        unpack_sends(sent[:16], acked)


def test_a_generators_records_go_through_a_file_and_come_back_equal(tmp_path):
    from verl_laminar.bench.pool_load import pack_sends, read_records, write_records

    rows = [(1.5, 1.75), (2.0, None), (3.25, 4.0)]
    waits = [(10.0, 0.25), (11.5, 1.5)]
    path = str(tmp_path / "generator0.bin")
    write_records(path, pack_sends(rows), waits)
    assert read_records(path) == (rows, waits)
    write_records(path, pack_sends([]), [])
    assert read_records(path) == ([], [])
    with open(path, "wb") as f:
        f.write((8).to_bytes(8, "little") + b"\0" * 8)
    with pytest.raises(ValueError, match="1 record parts, expected 3"):
        read_records(path)


def test_pool_busy_is_cpu_seconds_per_wall_second_between_two_answers():
    from verl_laminar.bench.pool import pool_busy

    out = pool_busy({"cpu_s": 10.0, "at": 100.0}, {"cpu_s": 25.0, "at": 130.0})
    assert out == {"pool_cpu_s": 15.0, "pool_busy_fraction": 0.5}
    assert pool_busy({"cpu_s": 1.0, "at": 1.0}, {}) == {"pool_cpu_s": None, "pool_busy_fraction": None}


def test_the_shards_stats_add_up_to_one_pools():
    from verl_laminar.bench.pool import merged, pools_busy

    first = [{"cpu_s": 10.0, "at": 100.0}, {"cpu_s": 2.0, "at": 100.5}]
    last = [{"cpu_s": 25.0, "at": 130.0}, {"cpu_s": 8.0, "at": 130.5}]
    assert pools_busy(first, last) == {"pool_cpu_s": 21.0, "pool_busy_fraction": 0.7,
                                       "shard_busy_fractions": [0.5, 0.2]}
    missing = pools_busy(first, [last[0], dict.fromkeys(("cpu_s", "at"))])  # a shard that did not answer in time
    assert missing["pool_busy_fraction"] is None and missing["shard_busy_fractions"] == [0.5, None]
    a = {"open_entries": 5, "compaction_s_max": 0.2, "compaction_s_total": 0.3, "compactions": 2, "rss_bytes": 100,
         "log_bytes": 7}
    b = {"open_entries": 3, "compaction_s_max": 0.4, "compaction_s_total": 0.4, "compactions": 1, "rss_bytes": 50,
         "log_bytes": 1}
    assert merged([a, b]) == {"open_entries": 8, "compaction_s_max": 0.4, "compaction_s_total": 0.7, "compactions": 3,
                              "rss_bytes": 150, "log_bytes": 8}
    assert merged([a, {**b, "open_entries": None}])["open_entries"] is None  # unknown, not understated


def test_the_shards_comparison_takes_distinct_counts_and_ratios_against_the_first():
    import argparse

    from verl_laminar.bench.pool_shards import compare, shard_counts

    assert shard_counts("1,2,4") == [1, 2, 4]
    for bad in ("2", "1,1", "0,2"):
        with pytest.raises(argparse.ArgumentTypeError):
            shard_counts(bad)
    runs = {1: {"sustained_appends_per_s": 100.0, "delay_p99_s": 2.0},
            2: {"sustained_appends_per_s": 150.0, "delay_p99_s": 0.5}}
    assert compare(runs) == {"2": {"sustained_ratio": 1.5, "delay_p99_ratio": 0.25}}
    assert compare({1: {"sustained_appends_per_s": 0.0, "delay_p99_s": None}, 2: runs[2]})["2"] == {
        "sustained_ratio": None, "delay_p99_ratio": None}
