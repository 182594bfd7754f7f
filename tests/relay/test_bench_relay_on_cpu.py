"""The relay benchmark: refuses to run without namespaces/tc, and a small run on a real testbed."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from verl_laminar.bench import relay as bench
from verl_laminar.relay.netns import NetnsTestbed, NetnsUnavailable


def test_missing_tools_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda tool: None)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    with pytest.raises(NetnsUnavailable, match="`ip` is not installed"):
        NetnsTestbed(2, 100).up()


def test_bench_exits_nonzero_without_testbed(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert bench.main(["--relays", "2", "--size-mb", "1", "--json"]) == 2
    assert "need root" in capsys.readouterr().err


def _netns_usable() -> bool:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        return False
    try:
        NetnsTestbed(1, 100, prefix=f"lmt{os.getpid() % 10000}").up().down()
    except NetnsUnavailable:
        return False
    return True


@pytest.mark.skipif(not _netns_usable(), reason="needs root, ip netns, tc htb/u32")
def test_small_broadcast_on_testbed_both_transports_loopback_and_delta_rows(tmp_path, tiny_model_dir):
    proc = subprocess.Popen(
        [sys.executable, "-m", "verl_laminar.bench.relay", "--relays", "3", "--size-mb", "4",
         "--link-mbps", "400", "--loopback-mb", "16", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    stdout, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 0, stderr[-2000:]
    result = json.loads(stdout)
    assert sorted(result["transports"]) == ["mooncake", "tcp"]
    line_rate_s = (4 << 20) * 8 / (400 * 1e6)
    for name, r in result["transports"].items():
        assert r["transport"] == name and r["integrity"] == "ok" and r["relays"] == 3 and r["bytes"] == 4 << 20
        for key in ("chunks", "link_mbps", "t_broadcast_s", "t_one_copy_s", "ratio", "t_model_s", "trainer_stall_s"):
            assert r[key] > 0, (name, key)
        # the emulated link limits the copy (4 MiB at 400 Mbit/s takes >= 84 ms), and the chain is pipelined: a
        # store-and-forward chain of 3 relays would take about twice one copy
        assert r["t_one_copy_s"] >= 0.9 * line_rate_s and r["t_broadcast_s"] >= 0.9 * line_rate_s, r
        assert r["ratio"] == pytest.approx(r["t_broadcast_s"] / r["t_one_copy_s"], rel=0.01)
        assert r["ratio"] < 1.8, r
    loop = result["loopback"]
    assert sorted(loop["rows"]) == ["mooncake", "tcp", "tcp_before"]
    for name, r in loop["rows"].items():
        assert r["integrity"] == "ok" and r["gb_per_s"] > 0 and r["relay_cpu_s_per_gb"] > 0, (name, r)
        assert len(r["t_hop_s"]) == r["repeats"]
    assert loop["tcp_speedup_vs_before"] == pytest.approx(
        loop["rows"]["tcp"]["gb_per_s"] / loop["rows"]["tcp_before"]["gb_per_s"], rel=0.01)
    # the delta rows: versions of the tiny model trained at lr 1e-6, version 1 sent whole (off) and as a delta (auto)
    deltas = result["delta"]
    assert deltas["versions"]["lr"] == 1e-6 and 0 < deltas["versions"]["changed_share_model"][0] < 0.01, deltas
    off, auto = deltas["modes"]["off"], deltas["modes"]["auto"]
    assert off["integrity"] == auto["integrity"] == "ok", deltas
    assert off["sent_as_delta"] == off["applied"] == 0 and off["bytes_whole_sent"] >= 2 * (4 << 20), off
    assert auto["sent_as_delta"] == 1 and auto["applied"] == 2, auto  # both downstream relays rebuilt it
    assert 0 < auto["wire_bytes"] == auto["bytes_delta_sent"] < 0.05 * off["wire_bytes"], (auto, off)
    assert deltas["delta_bytes"] < deltas["version_bytes"] and deltas["rebuild_s"] > 0
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    assert not [n for n in listed if n.startswith(f"lmr{proc.pid % 100000}")]  # it removed what it created
