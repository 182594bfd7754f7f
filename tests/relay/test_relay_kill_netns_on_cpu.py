"""SIGKILL a relay mid-broadcast on a rate-limited namespace network, over each transport: nothing is lost,
the chain reroutes around it, and the next version reaches every survivor.

Unlike the loopback kill test (paced TCP sends), the link here is shaped by tc, which is the only way to slow
Mooncake's data path: the kill lands mid-broadcast for either transport.
"""

import hashlib
import os
import time

import pytest

from verl_laminar.policy.chain import ChainPlan, plan_chain
from verl_laminar.relay.netns import NetnsTestbed
from verl_laminar.relay.publish import publish_bytes
from verl_laminar.relay.serve import RelayProcess
from verl_laminar.relay.transport import TransportSpec

MB = 1 << 20
LINK_MBIT = 160  # 20 MB/s per link: 16 MB take ~0.8 s per hop


def _sha(b) -> str:
    return hashlib.sha256(b).hexdigest()


@pytest.fixture(params=["tcp", "mooncake"])
def relays(request, tmp_path):
    bed = NetnsTestbed(4, LINK_MBIT, prefix=f"lmk{os.getpid() % 10000}").up()
    spec = TransportSpec(request.param)
    procs = [RelayProcess(f"r{i}", root=str(tmp_path / f"store{i}"), control=str(tmp_path / f"ctl{i}.sock"),
                          host=bed.ip(i), netns=bed.ns(i), io_timeout_s=10.0, transport=spec)
             for i in range(4)]
    try:
        for p in procs:
            p.wait_ready()
        yield procs
    finally:
        for p in procs:
            p.stop()
        bed.down()


def test_kill_relay_mid_broadcast(relays):
    by_id = {p.relay_id: p for p in relays}
    addrs = {p.relay_id: tuple(p.call("address")) for p in relays}
    plan = ChainPlan(relays=plan_chain(addrs, master="r0").relays, chunks=16)
    for p in relays:
        assert p.call("set_chain", plan, addrs)
    v1 = os.urandom(16 * MB)
    publish_bytes(by_id["r0"], 1, v1)

    deadline = time.monotonic() + 20
    while by_id["r2"].call("progress").get(1, 0) < 2:
        assert time.monotonic() < deadline, "r2 never started receiving version 1"
        time.sleep(0.01)
    assert by_id["r2"].call("newest") is None, "the kill must land mid-broadcast"
    t_kill = time.time()
    by_id["r2"].kill()

    for rid in ("r0", "r1", "r3"):
        assert by_id[rid].call("wait_version", 1, 30.0), f"{rid} lost version 1"
        assert by_id[rid].call("hash_version", 1) == _sha(v1)
    rebuilt = [e for e in by_id["r1"].call("events") if e["event"] == "chain_rebuilt"]
    assert rebuilt and rebuilt[0]["dropped"] == "r2" and rebuilt[0]["new_downstream"] == "r3"
    assert rebuilt[0]["t_rebuilt"] - t_kill < 2.0
    assert by_id["r1"].call("chain").relays == ("r0", "r1", "r3")

    v2 = os.urandom(4 * MB)
    publish_bytes(by_id["r0"], 2, v2)
    for rid in ("r0", "r1", "r3"):
        assert by_id[rid].call("wait_version", 2, 30.0)
        assert by_id[rid].call("versions") == [1, 2]
        assert by_id[rid].call("hash_version", 2) == _sha(v2)
