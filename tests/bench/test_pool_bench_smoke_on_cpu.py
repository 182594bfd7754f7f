"""The pool benchmark end to end at a toy size: a local Ray, the real pool actor and log, two generators."""

import json

import pytest

from verl_laminar.bench import pool as bench

pytestmark = [pytest.mark.slow, pytest.mark.ray_driver]  # starts a Ray instance (30-90 s on 2 shared cores)

KEYS = ("offered_appends_per_s", "sustained_appends_per_s", "delay_p50_s", "delay_p99_s", "open_entries",
        "compaction_s", "pool_rss_bytes", "end_wait_p50_s", "end_wait_p99_s")


@pytest.mark.parametrize("shards", [1, 2])
def test_a_toy_fleet_is_measured_with_every_key(capsys, tmp_path, shards):
    rc = bench.main(["--replicas", "2", "--seqs", "4", "--median-tokens", "60", "--max-tokens", "200",
                     "--duration-s", "8", "--warmup-s", "2", "--log-dir", str(tmp_path), "--json",
                     "--shards", str(shards), "--held-entries", "0"])  # no held entries: the log compacts
    assert rc == 0
    out = json.loads(capsys.readouterr().out)  # stdout holds the JSON alone
    for key in KEYS + ("date", "machine", "command", "commit"):
        assert key in out, key
    assert out["nominal_appends_per_s"] == 8.0 and out["running_sequences"] == 8
    assert out["chunks_in_window"] > 0 and out["sustained_appends_per_s"] > 0
    assert out["delay_p99_s"] >= out["delay_p50_s"] > 0
    assert out["open_entries"] >= 1 and out["pool_rss_bytes"] > 0 and out["compactions"] >= 1
    assert out["ends_in_window"] > 0  # responses of ~60 tokens end within the window
    assert out["shards"] == shards and len(out["shard_busy_fractions"]) == shards
    assert list(tmp_path.iterdir()) == []  # the log's folder is removed
