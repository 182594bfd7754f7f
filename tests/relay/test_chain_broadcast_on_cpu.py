"""In-process relays on loopback: pipelined chain broadcast, pull, torn upstream, tensors round trip.

The chain tests run over each transport (``tcp``; ``mooncake``: Mooncake's own TCP protocol here)."""

import hashlib
import os

import pytest
import torch

from verl_laminar.policy.chain import ChainPlan
from verl_laminar.relay.client import pull
from verl_laminar.relay.manifest import VersionManifest
from verl_laminar.relay.publish import LocalHandle, Publisher
from verl_laminar.relay.relay import Relay
from verl_laminar.relay.store import VersionGoneError
from verl_laminar.relay.tensors import publish_tensors, read_tensors
from verl_laminar.relay.transport import Frame, Kind, TcpTransport
from verl_laminar.relay.transport_spec import TransportSpec


@pytest.fixture(params=["tcp", "mooncake"])
def spec(request):
    return TransportSpec(request.param)


@pytest.fixture(params=["off", "auto"], ids=lambda d: f"delta_{d}")
def delta_mode(request):
    return request.param


@pytest.fixture
def chain(tmp_path, spec, delta_mode):
    relays = [Relay(f"r{i}", root=str(tmp_path / f"r{i}"), io_timeout_s=5.0, transport=spec, delta=delta_mode)
              for i in range(4)]
    addrs = {r.relay_id: r.address() for r in relays}
    plan = ChainPlan(relays=tuple(addrs), chunks=8)
    for r in relays:
        r.set_chain(plan, addrs)
    yield relays
    for r in relays:
        r.close(destroy=True)


def _sha(b):
    return hashlib.sha256(b).hexdigest()


def test_versions_reach_every_relay_in_chunks(chain, spec, delta_mode):
    assert all(r.transport.name == spec.kind for r in chain)
    pub = Publisher(LocalHandle(chain[0]))
    pub.prepare(1 << 20)
    data = os.urandom(1 << 20)
    for v in (1, 2, 3, 4):  # from the third on, every relay receives into an evicted version's pages
        # with deltas: each version changes one byte in 128 of the last (sparse, so it goes as a delta)
        data = bytes(b ^ (i % 128 == v) for i, b in enumerate(data)) if delta_mode == "auto" and v > 1 else (
            os.urandom(1 << 20))
        pub.publish_bytes(v, data)
        for r in chain:
            assert r.wait_version(v, 10)
            m, view = r.reader().open(v)
            assert _sha(view) == _sha(data) and m.num_chunks == 8
            view.release()
    pub.close()
    assert all(r.versions() == [3, 4] for r in chain)
    assert all(r.timings(4)["source"] != "publish" for r in chain[1:])
    assert [r.delta_stats()["applied"] for r in chain[1:]] == [3 if delta_mode == "auto" else 0] * 3


def test_chunks_are_pipelined(tmp_path):
    paced = TcpTransport(rate_bytes_per_s=8 << 20)  # 1 MiB per hop takes ~125 ms
    relays = [Relay(f"p{i}", root=str(tmp_path / f"p{i}"), transport=paced) for i in range(4)]
    try:
        addrs = {r.relay_id: r.address() for r in relays}
        for r in relays:
            r.set_chain(ChainPlan(relays=tuple(addrs), chunks=16), addrs)
        Publisher(LocalHandle(relays[0])).publish_bytes(1, os.urandom(1 << 20))
        assert relays[-1].wait_version(1, 10)
        first = [r.timings(1)["t_first_chunk"] for r in relays[1:]]
        done = [r.timings(1)["t_complete"] for r in relays[1:]]
        assert first[-1] < done[0]  # the tail had chunk 0 before r1 had the last chunk
        hop = done[0] - relays[0].timings(1)["t_complete"]
        assert done[-1] - done[0] < 1.5 * hop  # three hops cost far less than three copies
    finally:
        for r in relays:
            r.close(destroy=True)


def test_pull_newest_and_missing(chain):
    data = os.urandom(300_000)
    Publisher(LocalHandle(chain[0])).publish_bytes(4, data)
    assert chain[2].wait_version(4, 10)
    m, view = pull(chain[2].address())
    assert m.version == 4 and _sha(view) == _sha(data)
    with pytest.raises(VersionGoneError):
        pull(chain[2].address(), version=99)


def test_torn_upstream_never_readable(tmp_path):
    r = Relay("solo", root=str(tmp_path / "solo"))
    try:
        m = VersionManifest(version=1, total_bytes=4096, chunk_size=1024)
        ch = TcpTransport().connect(r.address())
        ch.send(Frame(Kind.BEGIN, version=1), m.to_json().encode())
        assert ch.recv_header().kind == Kind.ACCEPT
        ch.send(Frame(Kind.CHUNK, version=1, index=0, crc=0xDEAD), b"\0" * 1024)  # wrong crc
        ch.close()
        ch = TcpTransport().connect(r.address())  # and a sender that dies mid-version
        ch.send(Frame(Kind.BEGIN, version=2), VersionManifest(version=2, total_bytes=4096, chunk_size=1024)
                .to_json().encode())
        assert ch.recv_header().kind == Kind.ACCEPT
        ch.close()
        assert not r.wait_version(1, 0.5)
        assert r.versions() == [] and r.progress() == {}
    finally:
        r.close(destroy=True)


def test_tensors_round_trip_through_chain(chain):
    torch.manual_seed(0)
    named = [("a.weight", torch.randn(33, 7)), ("b.bias", torch.randn(5).to(torch.bfloat16)),
             ("c", torch.arange(10, dtype=torch.int64))]
    pub = Publisher(LocalHandle(chain[0]))
    publish_tensors(pub, 1, named)  # first publish: no warm buffer yet
    publish_tensors(pub, 2, [(n, t * 2) for n, t in named])  # warm path
    pub.close()
    assert chain[-1].wait_version(2, 10)
    m, view = chain[-1].reader().open(2)
    got = dict(read_tensors(m, view))
    for n, t in named:
        assert got[n].dtype == t.dtype and torch.equal(got[n], t * 2)
