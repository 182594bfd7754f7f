"""Each transport's side of the channel seam (tcp, mooncake): torn transfers over a hand-driven upstream, placed
chunks, mismatched transports, a missing Mooncake. The chain over both is in test_chain_broadcast_on_cpu.py.

Mooncake runs its own TCP data protocol here (``protocol: tcp``); on a cluster the same code takes ``rdma``.
"""

import os
import time

import pytest

from verl_laminar.relay.manifest import VersionManifest, crc32
from verl_laminar.relay.relay import Relay
from verl_laminar.relay.transport import PLACED, Frame, Kind, TcpTransport, TransportError
from verl_laminar.relay.transport_spec import TransportSpec

TRANSPORTS = ["tcp", "mooncake"]


@pytest.fixture(params=TRANSPORTS)
def spec(request):
    return TransportSpec(request.param)


@pytest.fixture(autouse=True)
def senders():
    """The senders' transports a test built (``_begin``), closed at its end as a relay closes its own: a Mooncake
    engine left running reaches the interpreter's shutdown (see the engine test below)."""
    built = []
    yield built
    for transport in built:
        transport.close()


def _begin(spec, relay, version, size=4096, chunk=1024, senders=None):
    """A hand-driven upstream: BEGIN, then the ACCEPT (and its buffer description) bound like a forwarder does."""
    transport = spec.build()
    if senders is not None:
        senders.append(transport)
    ch = transport.connect(relay.address())
    m = VersionManifest(version=version, total_bytes=size, chunk_size=chunk)
    ch.send(Frame(Kind.BEGIN, version=version), m.with_checksums(()).to_json().encode())
    reply = ch.recv_header()
    assert reply.kind == Kind.ACCEPT
    ch.bind_peer(ch.recv_payload(reply.length) if reply.length else b"")
    return ch, m


def test_torn_transfers_never_become_readable(tmp_path, spec, senders):
    r = Relay("solo", root=str(tmp_path / "solo"), transport=spec, io_timeout_s=5.0)
    src = tmp_path / "src.data"
    data = os.urandom(4096)
    src.write_bytes(data)
    try:
        ch, m = _begin(spec, r, 1, senders=senders)  # a chunk whose bytes do not match its CRC
        with open(src, "rb", buffering=0) as f:
            ch.send_file(Frame(Kind.CHUNK, version=1, index=0, crc=crc32(data[:1024]) ^ 1), f, 0, 1024)
        ch.close()
        ch, m = _begin(spec, r, 2, senders=senders)  # an upstream that dies after two good chunks
        with open(src, "rb", buffering=0) as f:
            for i in (0, 1):
                off, n = m.chunk_span(i)
                ch.send_file(Frame(Kind.CHUNK, version=2, index=i, crc=crc32(data[off:off + n])), f, off, n)
        ch.close()
        assert not r.wait_version(1, 0.5)
        assert r.versions() == [] and r.progress() == {}
        ch, m = _begin(spec, r, 3, senders=senders)  # and a whole one does
        with open(src, "rb", buffering=0) as f:
            for i in range(m.num_chunks):
                off, n = m.chunk_span(i)
                ch.send_file(Frame(Kind.CHUNK, version=3, index=i, crc=crc32(data[off:off + n])), f, off, n)
        ch.send(Frame(Kind.END, version=3))
        assert ch.recv_header().kind == Kind.END
        ch.close()
        m3, view = r.reader().open(3)
        assert bytes(view) == data
        view.release()
    finally:
        r.close(destroy=True)


def test_mooncake_chunks_are_placed_not_streamed(tmp_path, senders):
    """Over mooncake a CHUNK header carries PLACED and no payload bytes follow it on the control stream."""
    r = Relay("solo", root=str(tmp_path / "solo"), transport=TransportSpec("mooncake"), io_timeout_s=5.0)
    try:
        ch, m = _begin(TransportSpec("mooncake"), r, 1, size=1 << 20, chunk=1 << 20, senders=senders)
        sent = []

        class Counting:  # the control socket, counting what is written to it
            def __init__(self, sock):
                self._sock = sock

            def __getattr__(self, name):
                return getattr(self._sock, name)

            def sendall(self, b, *a):
                sent.append(len(b))
                return self._sock.sendall(b, *a)

        ch.sock = Counting(ch.sock)
        src = tmp_path / "src.data"
        data = os.urandom(1 << 20)
        src.write_bytes(data)
        with open(src, "rb", buffering=0) as f:
            ch.send_file(Frame(Kind.CHUNK, version=1, index=0, crc=crc32(data)), f, 0, len(data))
        ch.send(Frame(Kind.END, version=1))
        assert ch.recv_header().kind == Kind.END
        assert max(sent) < 64  # headers only: the megabyte went by one-sided write
        m1, view = r.reader().open(1)
        assert bytes(view) == data
        view.release()
    finally:
        r.close(destroy=True)


def _threads() -> set[int]:
    return {int(t) for t in os.listdir("/proc/self/task")}


def _name(tid: int) -> str:
    try:
        with open(f"/proc/self/task/{tid}/comm") as f:
            return f"{tid}:{f.read().strip()}"
    except OSError:  # it ended while we looked
        return f"{tid}:gone"


def _still_running(started: set[int], deadline_s: float = 10.0) -> list[str]:
    """The started threads still alive once they had ``deadline_s`` to finish: a close ends them, but a thread
    (the relay's connection handler, an engine worker) leaves its loop on its own schedule after its socket or
    engine is gone, so one seen alive right after close is not yet a leak."""
    end = time.monotonic() + deadline_s
    while (alive := started & _threads()) and time.monotonic() < end:
        time.sleep(0.05)
    return [_name(t) for t in sorted(alive)]


def test_closing_a_mooncake_relay_and_sender_ends_their_engines_threads(tmp_path):
    """Each Transfer Engine runs threads of its own; a relay's close (and a sender transport's) stops them. Before,
    every engine the relay tests started still ran at the test runner's interpreter shutdown, beside Ray's and
    the C++ static destructors, where the runner once died of a segmentation fault after its summary."""
    from verl_laminar.relay.mooncake import load_engine_class

    load_engine_class()  # the library's own runtime threads start at import: not the engine's
    before = _threads()
    r = Relay("solo", root=str(tmp_path / "solo"), transport=TransportSpec("mooncake"), io_timeout_s=5.0)
    sender = TransportSpec("mooncake").build()
    ch = sender.connect(r.address())
    started = _threads() - before
    assert len(started) >= 2, started  # both engines run threads (the relay's and the sender's)
    ch.close()
    sender.close()
    r.close(destroy=True)
    alive = _still_running(started)
    assert not alive, f"engine threads still running 10 s after close: {alive}"
    with pytest.raises(TransportError, match="closed"):
        ch._engine.write("peer:1", 0, 0, 1)  # a channel that outlived its transport says so, never a crash


def test_a_tcp_sender_refuses_a_one_sided_accept():
    class Sock:  # TcpChannel only needs a socket to exist for bind_peer
        pass

    from verl_laminar.relay.transport import TcpChannel

    ch = TcpChannel(Sock(), "peer:1")
    with pytest.raises(TransportError, match="same laminar.relay.transport"):
        ch.bind_peer(b'{"session": "x:1", "addr": 1, "len": 1}')
    ch.bind_peer(b"")  # a tcp ACCEPT


def test_placed_flag_is_outside_every_kind():
    kinds = [v for k, v in vars(Kind).items() if not k.startswith("_")]
    assert all(k & PLACED == 0 for k in kinds) and max(kinds) < PLACED


def test_mooncake_missing_names_the_install_line(monkeypatch):
    import builtins

    from verl_laminar.relay import mooncake

    real = builtins.__import__

    def fake(name, *a, **k):
        if name == "mooncake.engine":
            raise ImportError("libibverbs.so.1: cannot open shared object file")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(mooncake.MooncakeUnavailable, match="apt-get install -y libibverbs1 librdmacm1 libnuma1"):
        TransportSpec("mooncake").build()


def test_spec_rejects_what_cannot_work():
    with pytest.raises(ValueError, match="must be one of"):
        TransportSpec("udp")
    with pytest.raises(ValueError, match="tcp transport"):
        TransportSpec("mooncake", rate_bytes_per_s=1e6)
    from verl_laminar.relay.mooncake import MooncakeTransport

    with pytest.raises(ValueError, match="laminar.relay.protocol"):
        MooncakeTransport("ib")
    assert isinstance(TransportSpec().build(), TcpTransport)


@pytest.mark.parametrize("waited_s, want_s", [
    (0.0, 20e-6),  # the floor: a fresh write is checked again soon
    (1e-3, 1e-4),  # a tenth of the wait so far
    (5e-3, 5e-4),
    (0.5, 1e-3),  # the ceiling: a long write is never more than 1 ms late
])
def test_poll_delay_is_a_tenth_of_the_wait_within_bounds(waited_s, want_s):
    from verl_laminar.relay.mooncake import poll_delay

    assert poll_delay(waited_s) == pytest.approx(want_s)
