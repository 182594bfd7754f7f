"""Relay join on the emulated cluster with real relay actors: a replica on a node without a relay (w2, as if it
joined after the start) gets a relay spawned on w2 before it joins; when that relay dies, the group's monitor drops
it from the chain and the next replica on w2 gets a new one there (``trainer.relays.replica_relays``,
``RelayGroup.ensure_relay``). The driver runs in the head (``emulated_relay_driver.py``)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from verl_laminar.fleet.emulated import EmulatedCluster, unavailable
from verl_laminar.fleet.emulated_spec import ClusterSpec, NodeSpec

DRIVER = Path(__file__).with_name("emulated_relay_driver.py")


@pytest.mark.skipif(bool(unavailable()), reason=unavailable() or "ok")
@pytest.mark.e2e
def test_a_replica_on_a_node_without_a_relay_gets_one_there_also_after_its_relay_died(tmp_path):
    t0 = time.monotonic()
    with EmulatedCluster(ClusterSpec(base_dir=str(tmp_path)), [NodeSpec("head"), NodeSpec("w1"), NodeSpec("w2")]) as c:
        assert c.probe("nodes", "--alive", "3", "--timeout-s", "60")["ok"]
        env = {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        res = c.head_run([sys.executable, str(DRIVER)], timeout_s=300, env=env)
        lines = [line for line in res.stdout.splitlines() if line.startswith("{")]
        assert res.returncode == 0 and lines, res.stderr[-3000:]
        out = json.loads(lines[-1])
        w2_node, w2_ip = out["nodes"]["w2"]
        assert w2_ip == c.nodes["w2"].ip
    assert out["chain_before"] == ["r0", "r1"]
    first, second = out["first"], out["second"]
    # the relay each replica got runs on w2 and listens on w2's address
    assert (first["node"], first["ip"]) == (w2_node, w2_ip) and (second["node"], second["ip"]) == (w2_node, w2_ip)
    assert out["chain_joined"] == ["r0", "r1", first["relay_id"]]
    assert out["chain_dropped"] == ["r0", "r1"]  # the monitor ran: the dead relay left the chain
    assert second["relay_id"] != first["relay_id"] and out["chain_after"] == ["r0", "r1", second["relay_id"]]
    assert time.monotonic() - t0 < 300  # a bound, not the target
