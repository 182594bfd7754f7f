"""Which transport a relay builds (``laminar.relay.transport``), and building it.

Both transports sit below this module: ``transport.py`` (the frames, the ``Transport`` interface, TCP) and
``mooncake.py`` (one-sided writes, with its control frames on the TCP connection). Mooncake's engine itself is
imported only when a mooncake transport is built (``mooncake.load_engine_class``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from verl_laminar.relay.mooncake import MooncakeTransport
from verl_laminar.relay.transport import TcpTransport, Transport

TRANSPORTS = ("tcp", "mooncake")


@dataclass(frozen=True)
class TransportSpec:
    """What ``laminar.relay`` says about the transport, in a form that travels to a relay actor or process.

    ``kind``: tcp | mooncake; ``protocol`` (mooncake only): tcp | rdma; ``device``: Mooncake's NIC filter.
    """

    kind: str = "tcp"
    protocol: str = "tcp"
    device: Optional[str] = None
    rate_bytes_per_s: Optional[float] = None  # tcp: paced sends, for tests without tc
    buffer_bytes: int = 0  # tcp: fixed socket buffers; 0 = the kernel's autotuning

    def __post_init__(self) -> None:
        if self.kind not in TRANSPORTS:
            raise ValueError(f"laminar.relay.transport={self.kind!r}: must be one of {TRANSPORTS}")
        if self.kind == "mooncake" and self.rate_bytes_per_s:
            raise ValueError("paced sends (rate_bytes_per_s) exist only for the tcp transport; limit the link with tc")

    def build(self) -> Transport:
        if self.kind == "mooncake":
            return MooncakeTransport(self.protocol, self.device)
        return TcpTransport(self.rate_bytes_per_s, self.buffer_bytes)
