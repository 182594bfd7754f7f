"""The relay group's start-up check (relay/admit.py) on real relays in this process: /dev/shm room per node, and a
downstream relay whose port answers nothing reported in seconds, naming node, address and port."""

from __future__ import annotations

import socket
import time

import pytest

from verl_laminar.relay import admit
from verl_laminar.relay.relay import Relay

GIB = 2**30


def _site(rid, free, master=False, port=4000):
    return admit.RelaySite(rid, f"node-{rid}", "10.0.0.7", ("10.0.0.7", port), f"/dev/shm/laminar-relay/{rid}", free,
                           master)


def test_shm_room_counts_the_kept_versions_and_the_masters_spare():
    v = GIB
    assert admit.needed_bytes(v, 2, master=False) == 2 * v
    assert admit.needed_bytes(v, 2, master=True) == 3 * v
    sites = [_site("m", 3 * v, master=True), _site("r1", 2 * v), _site("r2", 2 * v - 1), _site("gone", None)]
    problems = admit.shm_problems(sites, v, 2)
    assert len(problems) == 1 and problems[0].startswith("relay r2 on node node-r2 (10.0.0.7): "
                                                         "/dev/shm/laminar-relay/r2 has 2.00 GiB free")
    assert "--shm-size" in problems[0] and "laminar.relay.keep_versions" in problems[0]
    # the master keeps one version more than the others: short by one byte, it fails as well
    assert [p.split(" ")[1] for p in admit.shm_problems([_site("m", 3 * v - 1, master=True)], v, 2)] == ["m"]
    assert admit.shm_problems(sites, None, 2) == []  # the version's size unknown: nothing to compare


def test_hops_follow_the_broadcast_and_name_both_ends():
    assert admit.hops(("m", "r1", "r2")) == [("m", "r1"), ("r1", "r2")]
    assert admit.hops(("m",)) == []
    sites = {"m": _site("m", GIB, True), "r1": _site("r1", GIB, port=45123)}
    [line] = admit.hop_problems(sites, {("m", "r1"): "timed out", ("r1", "r2"): None}, 15.0)
    assert line.startswith("relay m on node node-m (10.0.0.7) cannot reach its downstream relay r1 on node node-r1 "
                           "at 10.0.0.7:45123 (TCP) within 15 s: timed out")
    assert "ephemeral ports" in line and "laminar.relay.interface" in line
    refused = admit.hop_problem(sites["m"], sites["r1"], "[Errno 111] Connection refused", 0.5)
    assert "within 0.5 s" in refused and "nothing accepts connections there" in refused
    assert "ephemeral ports" not in refused
    err = admit.admission_error("g", [line])
    assert isinstance(err, admit.RelayAdmissionError) and "1 problem(s)" in str(err)


@pytest.fixture()
def relays(tmp_path):
    made = [Relay(f"adm{i}", root=str(tmp_path / f"adm{i}")) for i in range(2)]
    yield made
    for r in made:
        r.close(destroy=True)


def test_a_relay_reaches_a_live_neighbour_and_reports_its_store(relays):
    a, b = relays
    assert a.reach(b.address(), 5.0) is None
    info = b.info()
    assert info["store_free"] > 0 and info["root"].endswith("adm1")


def test_a_closed_port_fails_at_once_and_a_dropped_one_within_the_timeout(relays):
    a, _ = relays
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    closed = s.getsockname()
    s.close()
    t0 = time.monotonic()
    err = a.reach(closed, 5.0)
    assert time.monotonic() - t0 < 2.0  # refused at once, not after the timeout
    assert err is not None and f"127.0.0.1:{closed[1]}" in err and "refused" in err.lower(), err
    # a port whose SYNs are dropped, as behind a firewall: a listener whose accept queue is full and never drained
    black = socket.socket()
    black.bind(("127.0.0.1", 0))
    black.listen(0)
    addr = black.getsockname()
    fillers = []
    try:
        for _ in range(4):
            c = socket.socket()
            c.setblocking(False)
            c.connect_ex(black.getsockname())
            fillers.append(c)
        time.sleep(0.2)
        t0 = time.monotonic()
        err = a.reach(addr, 2.0)
        took = time.monotonic() - t0
    finally:
        for c in fillers:
            c.close()
        black.close()
    assert err is not None and f"127.0.0.1:{addr[1]}" in err and "timed out" in err, err
    assert took < 2.0 * 2 + 1.0, took  # connect and answer each bounded by the timeout, never minutes
