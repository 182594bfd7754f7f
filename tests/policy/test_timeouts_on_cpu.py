"""Refresh deadlines from the chain cost model (pure policy): they grow with the version's size and the chain's
length, never fall below the floor, and scale with the factor."""

import pytest

from verl_laminar.policy.chain import chain_time, t_model
from verl_laminar.policy.timeouts import (
    RefreshSettings,
    TimeoutPolicyError,
    arrival_mark,
    broadcast_time_s,
    chunk_count,
    load_time_s,
    refresh_deadlines,
)

GB = 1e9
SIZES = [1 * GB, 16 * GB, 145 * GB]
CHAINS = [2, 4, 16, 64]


def test_broadcast_time_is_the_chain_model_at_the_link_speed():
    tb = 8 / (10 * GB)  # 10 Gbit/s
    assert broadcast_time_s(145 * GB, 8, 10.0, 1e-3) == pytest.approx(t_model(8, 145 * GB, tb, 1e-3))
    assert broadcast_time_s(145 * GB, 8, 10.0, 1e-3, chunks=64) == pytest.approx(chain_time(8, 64, 145 * GB, tb, 1e-3))
    # one hop at 10 Gbit/s moves 145 GB in ~116 s: the size where a fixed 120 s deadline breaks
    assert broadcast_time_s(145 * GB, 2, 10.0, 0.0) == pytest.approx(116.0)


@pytest.mark.parametrize("chunks", [None, 64])
def test_broadcast_time_grows_with_size_and_chain_length_and_falls_with_link_speed(chunks):
    times = [[broadcast_time_s(w, p, 10.0, chunks=chunks) for p in CHAINS] for w in SIZES]
    for row in times:
        assert row == sorted(row) and len(set(row)) == len(row)
    for col in zip(*times):
        assert list(col) == sorted(col) and len(set(col)) == len(col)
    assert broadcast_time_s(16 * GB, 4, 100.0, chunks=chunks) < broadcast_time_s(16 * GB, 4, 10.0, chunks=chunks)


def test_a_single_relay_needs_no_broadcast():
    assert broadcast_time_s(145 * GB, 1, 10.0) == 0.0


def test_wait_deadline_is_the_factor_times_the_model_above_the_floor():
    s = RefreshSettings(link_gbps=10.0, wait_factor=3.0, min_wait_s=120.0)
    big = refresh_deadlines(145 * GB, 16, s, chunks=64)
    assert big.wait_readable_s == pytest.approx(3.0 * broadcast_time_s(145 * GB, 16, 10.0, chunks=64))
    assert big.wait_readable_s > 120.0
    doubled = refresh_deadlines(145 * GB, 16, RefreshSettings(wait_factor=6.0), chunks=64)
    assert doubled.wait_readable_s == pytest.approx(2 * big.wait_readable_s)


@pytest.mark.parametrize("w,p", [(0, 2), (1e6, 2), (1 * GB, 4), (145 * GB, 1)])
def test_the_floor_holds_for_small_versions_and_short_chains(w, p):
    s = RefreshSettings(min_wait_s=120.0)
    d = refresh_deadlines(w, p, s)
    assert d.wait_readable_s == 120.0 and d.load_s >= 120.0


def test_unknown_size_gives_the_floor_and_the_retries():
    d = refresh_deadlines(None, 64, RefreshSettings(min_wait_s=7.0, retries=5))
    assert (d.wait_readable_s, d.load_s, d.retries) == (7.0, 7.0, 5)


def test_load_deadline_grows_with_size_on_top_of_the_floor():
    s = RefreshSettings(min_wait_s=30.0, wait_factor=2.0, load_gbytes_s=1.0)
    loads = [refresh_deadlines(w, 4, s).load_s for w in SIZES]
    assert loads == sorted(loads) and len(set(loads)) == len(loads)
    assert loads[-1] == pytest.approx(30.0 + 2.0 * load_time_s(145 * GB, 1.0))
    assert refresh_deadlines(16 * GB, 4, RefreshSettings(load_gbytes_s=4.0)).load_s < \
        refresh_deadlines(16 * GB, 4, RefreshSettings(load_gbytes_s=1.0)).load_s


def test_chunk_count_from_a_manifest():
    assert chunk_count(10, 4) == 3 and chunk_count(8, 4) == 2 and chunk_count(0, 4) == 1


@pytest.mark.parametrize("kwargs, key", [
    ({"link_gbps": 0}, "laminar.relay.link_gbps=0"),
    ({"wait_factor": 0.5}, "laminar.refresh.wait_factor=0.5"),
    ({"min_wait_s": 0}, "laminar.refresh.min_wait_s=0"),
    ({"retries": -1}, "laminar.refresh.retries=-1"),
    ({"load_gbytes_s": 0}, "load_gbytes_s=0"),
])
def test_bad_settings_name_the_key(kwargs, key):
    with pytest.raises(TimeoutPolicyError, match=key):
        RefreshSettings(**kwargs)


def test_bad_sizes_are_rejected():
    with pytest.raises(TimeoutPolicyError, match="version_bytes"):
        broadcast_time_s(-1, 2, 10.0)
    with pytest.raises(TimeoutPolicyError, match="relays"):
        refresh_deadlines(GB, 0, RefreshSettings())


def test_settings_from_the_typed_config():
    from verl_laminar.config import LaminarConfig
    from verl_laminar.config.schema import RefreshConfig, RelayConfig

    lam = LaminarConfig(refresh=RefreshConfig(wait_factor=4.0, min_wait_s=60.0, retries=1),
                        relay=RelayConfig(link_gbps=25.0))
    s = lam.refresh_settings()
    assert (s.link_gbps, s.wait_factor, s.min_wait_s, s.retries) == (25.0, 4.0, 60.0, 1)
    d = LaminarConfig().refresh_settings()
    assert d == RefreshSettings()  # the YAML defaults and the policy defaults agree


@pytest.mark.parametrize("progress, version, mark", [
    ({}, 3, ()),
    (None, 3, ()),
    ({2: 5, 3: 1}, 3, ((3, 1),)),            # an older version's chunks do not keep a wait for 3 alive
    ({"4": "2", 3: 7}, 3, ((3, 7), (4, 2))),  # Ray may hand the keys back as strings; a newer version counts
])
def test_arrival_mark_is_what_of_the_version_or_newer_is_in_flight(progress, version, mark):
    assert arrival_mark(progress, version) == mark
