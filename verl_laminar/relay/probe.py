"""Link probes a relay runs against a neighbour: start-up time Ts and one point-to-point copy.

Ts: median of half the round trip of a header-only PING/PONG on one connection (one message's
fixed cost). One copy: a SINK frame announcing ``nbytes`` (in its version field), the raw bytes,
drained by the peer into a scratch buffer and confirmed with PONG; Tb = time / nbytes. Both use
the broadcast's own transport and link.
"""

from __future__ import annotations

import statistics
import time

from verl_laminar.relay.transport import Channel, Frame, Kind, Transport, TransportError

_SCRATCH = 4 << 20


def probe_latency(transport: Transport, address: tuple[str, int], n: int = 50) -> float:
    ch = transport.connect(address, timeout=10.0)
    try:
        rtts = []
        for i in range(n + 5):
            t0 = time.perf_counter()
            ch.send(Frame(Kind.PING, index=i))
            if ch.recv_header().kind != Kind.PONG:
                raise TransportError(f"{address} did not answer PING with PONG")
            if i >= 5:  # warm-up
                rtts.append(time.perf_counter() - t0)
        return statistics.median(rtts) / 2
    finally:
        ch.close()


def reach(transport: Transport, address: tuple[str, int], timeout_s: float) -> None:
    """One PING answered by PONG within ``timeout_s`` (connect and answer each), or ``TransportError``: whether a
    relay can open the connection a broadcast would. Bounded, so a port a firewall drops fails in seconds."""
    ch = transport.connect(address, timeout=timeout_s)
    try:
        ch.settimeout(timeout_s)
        ch.send(Frame(Kind.PING, index=0))
        if ch.recv_header().kind != Kind.PONG:
            raise TransportError(f"{address[0]}:{address[1]} did not answer PING with PONG")
    except TransportError:
        raise  # the channel's own errors (its timeout included) already name the peer
    except OSError as e:
        raise TransportError(f"{address[0]}:{address[1]} did not answer in {timeout_s:.0f} s: {e}") from e
    finally:
        ch.close()


def probe_copy(transport: Transport, address: tuple[str, int], nbytes: int) -> float:
    """Seconds to move ``nbytes`` to ``address`` as one message, until the peer confirms."""
    payload = memoryview(bytearray(min(_SCRATCH, max(nbytes, 1))))
    ch = transport.connect(address, timeout=10.0)
    try:
        t0 = time.perf_counter()
        ch.send(Frame(Kind.SINK, version=nbytes))
        sent = 0
        while sent < nbytes:
            k = min(len(payload), nbytes - sent)
            ch.send_raw(payload[:k])
            sent += k
        if ch.recv_header().kind != Kind.PONG:
            raise TransportError(f"{address} did not confirm the copy")
        return time.perf_counter() - t0
    finally:
        ch.close()


def drain(ch: Channel, first: Frame) -> None:
    """Peer side of ``probe_copy``."""
    scratch = memoryview(bytearray(_SCRATCH))
    left = first.version
    while left > 0:
        k = min(_SCRATCH, left)
        ch.recv_payload_into(scratch[:k])
        left -= k
    ch.send(Frame(Kind.PONG))
