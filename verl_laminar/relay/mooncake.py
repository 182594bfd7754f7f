"""Relay transport on Mooncake's Transfer Engine: one-sided writes of chunks into the peer's staging buffer.

Dataflow per hop (control frames stay on the TCP connection of ``transport.py``):
    receiver: BEGIN -> staging pages reserved -> ``expose``: the staging mapping registered with the engine
              -> ACCEPT carrying {session, addr, len}
    sender:   ``bind_peer`` -> per chunk: ``transfer_sync_write`` from its own registered mapping of the source
              file into ``addr + offset`` -> CHUNK header with ``PLACED`` (no payload bytes) -> ... -> END
The receiver's loop is the TCP one: it reads the CHUNK header, checks the CRC of the bytes now in place and
commits when all verified. A write that fails (peer gone, address not registered) is a ``TransportError``,
so reroute and retry work as over TCP. Mooncake's server checks every incoming write against its registered
buffers, so a stale or forged address is rejected, never written.

Protocols: ``tcp`` (Mooncake's own TCP data path; any machine) or ``rdma`` (``device`` names the NICs, e.g.
``mlx5_0,mlx5_1``; ``None`` lets Mooncake pick). Metadata is exchanged peer to peer (``P2PHANDSHAKE``): no etcd.
PULL and link probes keep their payloads inline on the TCP stream (a rollout's private pull buffer is not
registered, and a pull is the fallback path).

Requires ``pip install mooncake-transfer-engine-non-cuda`` (``mooncake-transfer-engine`` on CUDA nodes) and the
libraries it links (Debian: ``apt-get install libibverbs1 librdmacm1 libnuma1``); without them this transport
fails at start with that line.
"""

from __future__ import annotations

import ctypes
import json
import logging
import mmap
import os
import socket
import threading
import time
from typing import Any, BinaryIO, Optional

from verl_laminar.relay.transport import (
    _HEADER,
    MAGIC,
    PLACED,
    Frame,
    Kind,
    TcpChannel,
    TcpTransport,
    TransportError,
)

logger = logging.getLogger(__name__)

INSTALL_HINT = ("pip install mooncake-transfer-engine-non-cuda (mooncake-transfer-engine on CUDA nodes) and, on "
                "Debian/Ubuntu, apt-get install -y libibverbs1 librdmacm1 libnuma1")
PROTOCOLS = ("tcp", "rdma")
_POLL_MIN_S, _POLL_MAX_S = 20e-6, 1e-3  # completion polling of one write


class MooncakeUnavailable(RuntimeError):
    """Mooncake's Transfer Engine cannot be imported or started here; the message names the install line."""


def poll_delay(waited_s: float) -> float:
    """Sleep before the next completion check of a write waited on for ``waited_s`` (pure): a tenth of the wait so
    far, so a chunk is noticed within ~10% of its own duration, within [_POLL_MIN_S, _POLL_MAX_S]."""
    return min(_POLL_MAX_S, max(_POLL_MIN_S, 0.1 * waited_s))


def _address(buf) -> int:
    """Base address of a writable buffer (an mmap or a memoryview of one), without keeping an export on it."""
    c = ctypes.c_char.from_buffer(buf)
    try:
        return ctypes.addressof(c)
    finally:
        del c  # the mapping may be closed later; the ctypes view must not pin it


def load_engine_class():
    """``mooncake.engine.TransferEngine``, or ``MooncakeUnavailable`` with the install line."""
    # the engine's INFO/WARNING lines (per connection, per segment) would flood a job's log; errors still show, and
    # every failure that matters also comes back as a return code this module turns into an exception
    os.environ.setdefault("MC_LOG_LEVEL", "ERROR")
    try:
        from mooncake.engine import TransferEngine
    except ImportError as e:
        raise MooncakeUnavailable(f"laminar.relay.transport=mooncake needs Mooncake's Transfer Engine, which does "
                                  f"not import here ({e}); install it: {INSTALL_HINT}") from e
    return TransferEngine


class Engine:
    """One Transfer Engine per relay process, started on the address the relay binds."""

    def __init__(self, host: str, protocol: str, device: Optional[str]) -> None:
        if protocol not in PROTOCOLS:
            raise ValueError(f"laminar.relay.protocol={protocol!r}: must be one of {PROTOCOLS}")
        self.engine = load_engine_class()()
        ret = self.engine.initialize(host, "P2PHANDSHAKE", protocol, device or "")
        if ret != 0:
            hint = (" (no RDMA device found or laminar.relay.device names none; protocol tcp works without one)"
                    if protocol == "rdma" else "")
            raise MooncakeUnavailable(f"Mooncake Transfer Engine did not start on {host} with protocol {protocol}: "
                                      f"initialize returned {ret}{hint}")
        self.session = f"{host}:{self.engine.get_rpc_port()}"
        self.protocol = protocol
        self._lock = threading.Lock()

    def close(self) -> None:
        """Release the Transfer Engine: its destructor stops and joins the engine's own threads. An engine left
        running at interpreter shutdown keeps those threads working while C++ static destructors run."""
        with self._lock:
            self.engine = None

    def _live(self) -> Any:
        if self.engine is None:
            raise TransportError("the Mooncake transport is closed (its relay or client closed it)")
        return self.engine

    def register(self, addr: int, length: int) -> None:
        with self._lock:
            ret = self._live().register_memory(addr, length)
        if ret != 0:
            raise TransportError(f"Mooncake could not register {length} bytes at {addr:#x}: returned {ret}")

    def unregister(self, addr: int) -> None:
        with self._lock:
            if self.engine is None:  # closed: the engine freed its registrations with it
                return
            ret = self.engine.unregister_memory(addr)
        if ret != 0:
            logger.warning("Mooncake could not unregister the buffer at %#x: returned %d", addr, ret)

    def write(self, session: str, local: int, remote: int, length: int) -> None:
        """One one-sided write, waited for by polling with a growing sleep.

        Not ``transfer_sync_write``: it spins on the transfer status, and a relay runs at real-time priority on a
        busy host, where that spin starves the engine's own I/O threads (a chunk then waits for the scheduler's
        round-robin slice: hundreds of ms per chunk on 2 cores). The sleep adds about a tenth of a chunk's own time,
        at most ``_POLL_MAX_S``.
        """
        engine = self._live()
        batch = engine.transfer_submit_write(session, local, remote, length)
        if batch < 0:
            raise TransportError(f"Mooncake could not submit a write of {length} bytes to {session} (returned "
                                 f"{batch}): the peer is gone")
        t0 = time.perf_counter()
        while True:
            status = engine.transfer_check_status(batch)
            if status == 1:
                return
            if status < 0:
                what = "timed out (MC_TRANSFER_TIMEOUT)" if status == -2 else "failed"
                raise TransportError(f"Mooncake write of {length} bytes to {session} {what}: the peer is gone or no "
                                     "longer exposes that buffer")
            time.sleep(poll_delay(time.perf_counter() - t0))


class MooncakeChannel(TcpChannel):
    one_sided = True

    def __init__(self, sock: socket.socket, peer: str, engine: Engine) -> None:
        super().__init__(sock, peer)
        self._engine = engine
        self._exposed: Optional[int] = None  # receiver: our registered staging address
        self._peer: Optional[tuple[str, int, int]] = None  # sender: (session, addr, len) from ACCEPT
        self._source: Optional[tuple[tuple[int, int], mmap.mmap, int]] = None  # sender: (file id, mapping, addr)
        self._placed = False

    # ---- receiver ----
    def expose(self, view: memoryview) -> bytes:
        if len(view) == 0:
            return b""
        addr = _address(view)
        self._engine.register(addr, len(view))
        self._exposed = addr
        return json.dumps({"session": self._engine.session, "addr": addr, "len": len(view)}).encode()

    def recv_header(self) -> Frame:
        fr = super().recv_header()
        if fr.kind & PLACED:
            self._placed = True
            return Frame(fr.kind & ~PLACED, fr.version, fr.index, fr.length, fr.crc)
        return fr

    def recv_payload_into(self, view: memoryview) -> None:
        if self._placed:  # the bytes were written into our exposed buffer before the header was sent
            self._placed = False
            return
        super().recv_payload_into(view)

    # ---- sender ----
    def bind_peer(self, payload: bytes) -> None:
        if not payload:
            self._peer = None  # an empty version: nothing to write
            return
        try:
            d = json.loads(payload)
            self._peer = (str(d["session"]), int(d["addr"]), int(d["len"]))
        except (ValueError, KeyError, TypeError) as e:
            raise TransportError(f"{self.peer} sent an ACCEPT that does not describe a Mooncake buffer: "
                                 f"every relay of a group must use the same laminar.relay.transport ({e})") from e

    def _local(self, file: BinaryIO) -> int:
        """Our registered mapping of ``file`` (a version's data or staging file), made once per channel."""
        st = os.fstat(file.fileno())
        key = (st.st_dev, st.st_ino)
        if self._source is not None and self._source[0] == key:
            return self._source[2]
        self._release_source()
        fd = os.open(f"/proc/self/fd/{file.fileno()}", os.O_RDWR)  # registration wants a writable mapping
        try:
            mm = mmap.mmap(fd, st.st_size, access=mmap.ACCESS_WRITE)
        finally:
            os.close(fd)
        addr = _address(mm)
        try:
            self._engine.register(addr, st.st_size)
        except TransportError:
            mm.close()
            raise
        self._source = (key, mm, addr)
        return addr

    def send_file(self, frame: Frame, file: BinaryIO, offset: int, length: int) -> None:
        if frame.kind != Kind.CHUNK or self._peer is None or length == 0:
            super().send_file(frame, file, offset, length)
            return
        session, peer_addr, peer_len = self._peer
        if offset + length > peer_len:
            raise TransportError(f"chunk {frame.index} ({offset}+{length}) exceeds the {peer_len} bytes {self.peer} "
                                 "exposed")
        self._engine.write(session, self._local(file) + offset, peer_addr + offset, length)
        hdr = _HEADER.pack(MAGIC, frame.kind | PLACED, frame.version, frame.index, length, frame.crc)
        try:
            self.sock.sendall(hdr)
        except OSError as e:
            raise TransportError(f"send to {self.peer} failed: {e}") from e

    def _release_source(self) -> None:
        if self._source is not None:
            _, mm, addr = self._source
            self._source = None
            self._engine.unregister(addr)
            mm.close()

    def close(self) -> None:
        # unregister before the caller unmaps the staging buffer: no write may land in memory about to go away
        if self._exposed is not None:
            addr, self._exposed = self._exposed, None
            self._engine.unregister(addr)
        self._release_source()
        super().close()


class MooncakeListener:
    def __init__(self, host: str, port: int, engine: Engine) -> None:
        self._tcp = TcpTransport().listen(host, port)
        self.address = self._tcp.address
        self._engine = engine

    def accept(self) -> MooncakeChannel:
        ch = self._tcp.accept()
        return MooncakeChannel(ch.sock, ch.peer, self._engine)

    def close(self) -> None:
        self._tcp.close()


class MooncakeTransport:
    """Control frames on TCP, chunk payloads by Mooncake one-sided writes (``protocol`` tcp or rdma).

    The engine starts on the host of the first ``listen`` (the relay's own address), or on the first
    ``connect``'s local address for a process that only sends.
    """

    name = "mooncake"

    def __init__(self, protocol: str = "tcp", device: Optional[str] = None) -> None:
        if protocol not in PROTOCOLS:
            raise ValueError(f"laminar.relay.protocol={protocol!r}: must be one of {PROTOCOLS}")
        load_engine_class()  # fail at start, with the install line, not at the first broadcast
        self.protocol, self.device = protocol, device
        self._engine: Optional[Engine] = None
        self._lock = threading.Lock()

    def engine(self, host: str) -> Engine:
        with self._lock:
            if self._engine is None:
                self._engine = Engine(host, self.protocol, self.device)
            return self._engine

    def listen(self, host: str, port: int) -> MooncakeListener:
        return MooncakeListener(host, port, self.engine(host))

    def close(self) -> None:
        """Stop this transport's Transfer Engine (its threads end); a later listen or connect starts a new one."""
        with self._lock:
            engine, self._engine = self._engine, None
        if engine is not None:
            engine.close()

    def connect(self, address: tuple[str, int], timeout: float = 5.0) -> MooncakeChannel:
        ch = TcpTransport().connect(address, timeout)
        host = ch.sock.getsockname()[0]
        return MooncakeChannel(ch.sock, ch.peer, self.engine(host))
