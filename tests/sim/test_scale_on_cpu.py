"""sim.scale: the pool's load against its measured service rate, and the bytes a tensor-parallel rank copies."""

from pathlib import Path

import pytest

from verl_laminar.sim.params import DEFAULT_PARAMS
from verl_laminar.sim.scale import (
    POOL_SERVICE,
    PoolService,
    format_scale,
    offered_appends_per_s,
    pool_service_from,
    rank_bytes,
    running_sequences,
    scale_check,
)

REPO = Path(__file__).resolve().parents[2]


def test_the_pool_service_rate_is_the_committed_measurement():
    assert pool_service_from(REPO / POOL_SERVICE.source) == POOL_SERVICE


def test_offered_appends_follow_the_chunk_rule():
    # 8,192 sequences at 40 tokens/s: 64 tokens take 1.6 s, so the 1 s interval sends a chunk a second each
    assert offered_appends_per_s(8192, 8192 * 40.0) == pytest.approx(8192)
    # 8,192 sequences at 128 tokens/s: a chunk every 64 tokens, twice a second
    assert offered_appends_per_s(8192, 8192 * 128.0) == pytest.approx(16384)
    assert offered_appends_per_s(0, 1e6) == 0.0
    s = DEFAULT_PARAMS.schedule
    assert running_sequences(10**6, DEFAULT_PARAMS) == s.prompts_per_step * s.group_size


def test_a_rank_reads_its_shard_or_the_whole_version():
    whole = rank_bytes("72b", 8, shard=False)
    assert 140e9 < whole < 150e9  # Qwen2.5-72B in bf16: 145 GB
    assert rank_bytes("72b", 8, shard=True) == pytest.approx(whole / 8, rel=0.02)  # norms are replicated: tiny
    assert rank_bytes("7b", 1, shard=True) == rank_bytes("7b", 1, shard=False)
    # 7B has 4 key/value heads: at tp 8 each rank keeps one head's rows whole, more than 1/8 of k and v
    assert rank_bytes("7b", 8, shard=True) > rank_bytes("7b", 8, shard=False) / 8


def test_the_check_names_the_bottleneck():
    busy = scale_check("32b", 4, 30, 237e3, 90.0, DEFAULT_PARAMS, pool=PoolService(4000.0, True, "x.json"))
    assert busy["pool"]["utilization"] > 1 and "pool" in busy["bottlenecks"] and busy["label"] == "SIMULATED"
    idle = scale_check("32b", 4, 30, 237e3, 90.0, DEFAULT_PARAMS, pool=PoolService(1e6, True, "x.json"))
    assert idle["bottlenecks"] == []  # a 1.6 s whole-version refresh is < 5% of a 90 s step
    slow_step = scale_check("32b", 4, 30, 237e3, 10.0, DEFAULT_PARAMS, pool=PoolService(1e6, True, "x.json"))
    assert slow_step["bottlenecks"] == ["refresh"]
    assert idle["refresh"]["shard"]["refresh_s"] < idle["refresh"]["whole"]["refresh_s"]


def test_a_run_that_kept_up_bounds_the_rate_and_one_that_queued_is_its_ceiling():
    kept_up = pool_service_from(REPO / "docs/results/bench_pool_64x128_2026-12-07.json")
    assert not kept_up.saturated and kept_up.appends_per_s > 8000
    queued = pool_service_from(REPO / "docs/results/bench_pool_128x128_2026-12-07.json")
    assert queued.saturated and queued.appends_per_s > kept_up.appends_per_s  # it sustained more than it was offered


def test_the_pool_is_priced_with_the_shards_the_product_derives():
    from verl_laminar.pool.shards import running_bound, shards_for

    s, inf = DEFAULT_PARAMS.schedule, DEFAULT_PARAMS.inference
    derived = scale_check("32b", 4, 30, 237e3, 90.0, DEFAULT_PARAMS)
    want = shards_for(running_bound(30, inf.max_num_seqs, s.prompts_per_step * s.group_size))
    assert derived["pool"]["shards"] == want > 1  # laminar.pool.shards: null at this row
    one = scale_check("32b", 4, 30, 237e3, 90.0, DEFAULT_PARAMS, shards=1)
    assert one["pool"]["utilization"] == pytest.approx(derived["pool"]["utilization"] * want, rel=1e-2)
    assert f"x {want} shard(s)" in format_scale(derived)
