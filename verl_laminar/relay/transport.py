"""Point-to-point byte transport between relays, behind one small interface.

A ``Transport`` opens ``Channel``s (``connect``) and accepts them (``listen``). A channel carries
framed messages: a fixed header (kind, version, chunk index, payload length, CRC32) and a payload
that the receiver writes straight into its destination buffer (``recv_payload_into``), so a relay
receives a chunk directly into its shared-memory staging file and forwards it from there.

``TcpTransport`` is the default and works everywhere (blocking sockets, one thread per stream,
TCP_NODELAY; the GIL is released during ``sendall``/``recv_into``). Socket buffers are left to the kernel's
autotuning by default, which grows them to the bandwidth-delay product of the path; a fixed size caps a
fast link at ``buffer / RTT``.

One-sided transports (``relay/mooncake.py``) keep these frames on the TCP connection as control messages and
move CHUNK payloads by a one-sided write into the receiver's registered staging buffer. The seam is three
members every channel has:
    ``one_sided``         True when chunk payloads arrive by a write into exposed memory
    ``expose(view)``      receiver: make ``view`` (the version's staging buffer) writable by the peer; returns
                          the ACCEPT payload that describes it (empty for TCP)
    ``bind_peer(payload)`` sender: the ACCEPT payload; later ``send_file`` CHUNKs go into that buffer
A placed CHUNK's header has ``PLACED`` set in its kind byte and its payload length, but no payload bytes
follow it: ``recv_header`` clears the flag and the next ``recv_payload_into`` returns at once, since the
bytes already sit in place (the write completed before the header was sent). So the relay's receive loop,
its per-chunk CRC and its commit are the same code for every transport.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from dataclasses import dataclass
from typing import BinaryIO, Optional, Protocol

MAGIC = b"LMRL"
_HEADER = struct.Struct("!4sBQIQI")  # magic, kind, version, index, payload length, crc32
HEADER_SIZE = _HEADER.size
NEWEST = (1 << 64) - 1  # version field meaning "the newest you have"


PLACED = 0x80  # kind flag: the CHUNK's payload was written one-sided into the receiver's exposed buffer


class Kind:
    BEGIN = 1  # payload: manifest JSON; reply ACCEPT or SKIP
    ACCEPT = 2
    SKIP = 3
    CHUNK = 4  # index, crc; payload: chunk bytes
    END = 5
    PULL = 6  # version (or NEWEST); the server answers with a BEGIN / CHUNK... / END stream
    PING = 7
    PONG = 8
    MISSING = 9  # reply to PULL when the version is not readable
    SINK = 10  # link probe: version field = byte count of raw bytes that follow; answered with PONG
    WHOLE = 11  # reply to a delta's BEGIN (no base here) or instead of its END (rebuilt bytes failed the digest)


class TransportError(ConnectionError):
    """The peer went away or sent something that is not a relay frame."""


@dataclass(frozen=True)
class Frame:
    kind: int
    version: int = 0
    index: int = 0
    length: int = 0
    crc: int = 0


class Channel(Protocol):
    peer: str
    one_sided: bool

    def expose(self, view: memoryview) -> bytes: ...

    def bind_peer(self, payload: bytes) -> None: ...

    def send(self, frame: Frame, payload: bytes | memoryview = b"") -> None: ...

    def send_file(self, frame: Frame, file: BinaryIO, offset: int, length: int) -> None: ...

    def send_raw(self, payload: bytes | memoryview) -> None: ...

    def settimeout(self, seconds: Optional[float]) -> None: ...

    def recv_header(self) -> Frame: ...

    def recv_payload_into(self, view: memoryview) -> None: ...

    def recv_payload(self, n: int) -> bytes: ...

    def close(self) -> None: ...


class Listener(Protocol):
    address: tuple[str, int]

    def accept(self) -> Channel: ...

    def close(self) -> None: ...


class Transport(Protocol):
    def listen(self, host: str, port: int) -> Listener: ...

    def connect(self, address: tuple[str, int], timeout: float) -> Channel: ...

    def close(self) -> None: ...  # end what the transport itself runs (Mooncake: its engine's threads)


def _tune(sock: socket.socket, buffer_bytes: int) -> None:
    """NODELAY, and deep kernel buffers: while a busy host deschedules this relay for a moment, the
    bytes already queued keep its outgoing link busy, and its upstream can keep sending."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if buffer_bytes:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer_bytes)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer_bytes)


class TcpChannel:
    one_sided = False

    def __init__(self, sock: socket.socket, peer: str, rate_bytes_per_s: Optional[float] = None) -> None:
        self.sock = sock
        self.peer = peer
        self._rate = rate_bytes_per_s
        self._closed = False

    def expose(self, view: memoryview) -> bytes:
        return b""  # payloads travel inline on this stream

    def bind_peer(self, payload: bytes) -> None:
        if payload:
            raise TransportError(f"{self.peer} answered with a one-sided buffer description, but this relay uses "
                                 "the tcp transport: every relay of a group must use the same laminar.relay.transport")

    def settimeout(self, seconds: Optional[float]) -> None:
        self.sock.settimeout(seconds)

    def send(self, frame: Frame, payload: bytes | memoryview = b"") -> None:
        hdr = _HEADER.pack(MAGIC, frame.kind, frame.version, frame.index, len(payload), frame.crc)
        try:
            self.sock.sendall(hdr)
            if payload:
                self._send_payload(memoryview(payload))
        except OSError as e:  # includes BrokenPipe, ConnectionReset, socket.timeout
            raise TransportError(f"send to {self.peer} failed: {e}") from e

    def send_file(self, frame: Frame, file: BinaryIO, offset: int, length: int) -> None:
        """Send a frame whose payload is ``length`` bytes of ``file`` at ``offset`` (zero-copy sendfile)."""
        if self._rate:  # paced tests go through the buffered path (pread: never a stale read-ahead)
            self.send(frame, os.pread(file.fileno(), length, offset))
            return
        hdr = memoryview(_HEADER.pack(MAGIC, frame.kind, frame.version, frame.index, length, frame.crc))
        try:
            done = 0
            while done < len(hdr):  # MSG_MORE: the header leaves in the same segment as the payload
                done += self.sock.send(hdr[done:], socket.MSG_MORE if length else 0)
            if length:
                self.sock.sendfile(file, offset, length)
        except OSError as e:
            raise TransportError(f"send to {self.peer} failed: {e}") from e

    def send_raw(self, payload: bytes | memoryview) -> None:
        try:
            self._send_payload(memoryview(payload))
        except OSError as e:
            raise TransportError(f"send to {self.peer} failed: {e}") from e

    def _send_payload(self, view: memoryview) -> None:
        if not self._rate:
            self.sock.sendall(view)
            return
        step = 64 << 10  # paced sending, for tests without tc
        t0 = time.monotonic()
        for off in range(0, len(view), step):
            self.sock.sendall(view[off : off + step])
            ahead = (off + step) / self._rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)

    def _recv_exact_into(self, view: memoryview) -> None:
        got = 0
        try:
            while got < len(view):
                n = self.sock.recv_into(view[got:], len(view) - got, socket.MSG_WAITALL)
                if n == 0:
                    raise TransportError(f"{self.peer} closed the connection mid-frame ({got}/{len(view)} bytes)")
                got += n
        except OSError as e:
            if isinstance(e, TransportError):
                raise
            raise TransportError(f"receive from {self.peer} failed: {e}") from e

    def recv_header(self) -> Frame:
        buf = bytearray(HEADER_SIZE)
        self._recv_exact_into(memoryview(buf))
        magic, kind, version, index, length, crc = _HEADER.unpack(buf)
        if magic != MAGIC:
            raise TransportError(f"{self.peer} sent a frame without the relay magic ({bytes(magic)!r})")
        return Frame(kind, version, index, length, crc)

    def recv_payload_into(self, view: memoryview) -> None:
        self._recv_exact_into(view)

    def recv_payload(self, n: int) -> bytes:
        buf = bytearray(n)
        self._recv_exact_into(memoryview(buf))
        return bytes(buf)

    def close(self) -> None:
        if not self._closed:  # idempotent: a superseded transfer and its handler may both close it
            self._closed = True
            _close_socket(self.sock)


def _close_socket(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # peer already gone or never connected: closing is all that is left to do
        pass
    sock.close()


class TcpListener:
    def __init__(self, host: str, port: int, rate_bytes_per_s: Optional[float], buffer_bytes: int) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        _tune(self.sock, buffer_bytes)  # accepted sockets inherit the buffer sizes
        self.sock.bind((host, port))
        self.sock.listen(64)
        self.address = (host, self.sock.getsockname()[1])
        self._rate = rate_bytes_per_s

    def accept(self) -> TcpChannel:
        conn, addr = self.sock.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return TcpChannel(conn, f"{addr[0]}:{addr[1]}", self._rate)

    def close(self) -> None:
        _close_socket(self.sock)


class TcpTransport:
    """TCP transport. ``rate_bytes_per_s`` paces payload sends (tests without ``tc``);
    ``buffer_bytes`` sets SO_SNDBUF/SO_RCVBUF; 0 (the default) keeps the kernel's autotuning, which sizes them
    from the path's bandwidth-delay product (a fixed 4 MiB, the earlier default, caps a 100 Gbit/s link with a
    1 ms RTT at a third of its rate)."""

    name = "tcp"

    def __init__(self, rate_bytes_per_s: Optional[float] = None, buffer_bytes: int = 0) -> None:
        self.rate_bytes_per_s = rate_bytes_per_s
        self.buffer_bytes = buffer_bytes

    def close(self) -> None:
        """Nothing runs in a TCP transport itself: its listeners and channels close on their own."""

    def listen(self, host: str, port: int) -> TcpListener:
        return TcpListener(host, port, self.rate_bytes_per_s, self.buffer_bytes)

    def connect(self, address: tuple[str, int], timeout: float = 5.0) -> TcpChannel:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        _tune(sock, self.buffer_bytes)
        sock.settimeout(timeout)
        try:
            sock.connect(tuple(address))
        except OSError as e:
            sock.close()
            raise TransportError(f"cannot connect to relay at {address[0]}:{address[1]}: {e}") from e
        sock.settimeout(None)
        return TcpChannel(sock, f"{address[0]}:{address[1]}", self.rate_bytes_per_s)

