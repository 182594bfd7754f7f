"""Kill a relay process mid-broadcast: no version is lost and the chain is rebuilt in under 1 s."""

import hashlib
import os
import time

import pytest

from verl_laminar.policy.chain import ChainPlan, plan_chain
from verl_laminar.relay.client import RelayClient
from verl_laminar.relay.publish import publish_bytes
from verl_laminar.relay.serve import RelayProcess

MB = 1 << 20
RATE = 24 * MB  # paced sends: each hop of 24 MB takes ~1 s, so the kill lands mid-broadcast


@pytest.fixture
def relays(tmp_path):
    procs = [
        RelayProcess(f"r{i}", root=str(tmp_path / f"store{i}"), control=str(tmp_path / f"ctl{i}.sock"),
                     rate_bytes_per_s=RATE, io_timeout_s=10.0)
        for i in range(4)
    ]
    try:
        for p in procs:
            p.wait_ready()
        yield procs
    finally:
        for p in procs:
            p.stop()


def _sha(b) -> str:
    return hashlib.sha256(b).hexdigest()


def test_kill_relay_mid_broadcast(relays):
    by_id = {p.relay_id: p for p in relays}
    addrs = {p.relay_id: tuple(p.call("address")) for p in relays}
    plan = ChainPlan(relays=plan_chain(addrs, master="r0").relays, chunks=24)
    for p in relays:
        assert p.call("set_chain", plan, addrs)
    v1 = os.urandom(24 * MB)
    publish_bytes(by_id["r0"], 1, v1)

    # wait until r2 is receiving, then kill it for real (SIGKILL by PID)
    deadline = time.monotonic() + 10
    while by_id["r2"].call("progress").get(1, 0) < 3:
        assert time.monotonic() < deadline, "r2 never started receiving version 1"
        time.sleep(0.01)
    assert by_id["r2"].call("newest") is None, "kill must land mid-broadcast"
    t_kill = time.time()
    by_id["r2"].kill()
    assert not by_id["r2"].alive()

    for rid in ("r0", "r1", "r3"):
        assert by_id[rid].call("wait_version", 1, 20.0), f"{rid} lost version 1"
        assert by_id[rid].call("hash_version", 1) == _sha(v1)

    rebuilt = [e for e in by_id["r1"].call("events") if e["event"] == "chain_rebuilt"]
    assert rebuilt and rebuilt[0]["dropped"] == "r2" and rebuilt[0]["new_downstream"] == "r3"
    assert rebuilt[0]["t_rebuilt"] - t_kill < 1.0
    assert by_id["r1"].call("chain").relays == ("r0", "r1", "r3")

    # the rollout on r2's machine falls back to its upstream neighbour r1
    survivors = by_id["r1"].call("chain")
    client = RelayClient("r2", by_id["r2"].root, plan=lambda: survivors, addresses=lambda: addrs,
                         local_alive=lambda: by_id["r2"].alive())
    client._original_plan = plan
    m, view, src = client.get(1)
    assert src == "r1" and m.version == 1 and _sha(view) == _sha(v1)

    # the next version still reaches every survivor; the previous one stays readable
    v2 = os.urandom(2 * MB)
    publish_bytes(by_id["r0"], 2, v2)
    for rid in ("r0", "r1", "r3"):
        assert by_id[rid].call("wait_version", 2, 20.0)
        assert by_id[rid].call("versions") == [1, 2]
        assert by_id[rid].call("hash_version", 2) == _sha(v2)
