"""How a rollout gets a version: from its machine's relay, else pulled from another relay.

Dataflow:
    local relay alive  -> StoreReader(root).open(version): a read-only mmap, no copy
    local relay gone   -> fallback_source(plan) (pure) -> PULL over the transport -> a buffer the caller
                          allocates once the manifest is known (``node_pull``: one file in this machine's shared
                          memory for all its workers; ``pull``: a private one, for tools), every chunk
                          CRC-checked, so a torn pull is never returned
``serve_pull`` is the relay side of PULL: BEGIN (manifest with checksums), CHUNK..., END.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

from verl_laminar.policy.chain import ChainPlan, fallback_source
from verl_laminar.relay.manifest import VersionManifest, crc32
from verl_laminar.relay.store import RelayStore, StoreReader, TornTransferError, VersionGoneError
from verl_laminar.relay.transport import NEWEST, Channel, Frame, Kind, TcpTransport, Transport, TransportError

logger = logging.getLogger(__name__)


def serve_pull(store: RelayStore, ch: Channel, version: Optional[int]) -> None:
    try:
        stored = store.get(version)
    except VersionGoneError:
        ch.send(Frame(Kind.MISSING, version=version if version is not None else NEWEST))
        return
    reader = StoreReader(store.root)
    m, view = reader.open(stored.manifest.version)
    try:
        ch.send(Frame(Kind.BEGIN, version=m.version), m.to_json().encode())
        for i in range(m.num_chunks):
            off, length = m.chunk_span(i)
            ch.send(Frame(Kind.CHUNK, version=m.version, index=i, crc=m.checksums[i]), view[off : off + length])
        ch.send(Frame(Kind.END, version=m.version))
    finally:
        view.release()


def pull_into(
    address: tuple[str, int],
    version: Optional[int],
    alloc: Callable[[VersionManifest], Optional[memoryview]],
    transport: Optional[Transport] = None,
    timeout_s: float = 60.0,
    on_chunk: Optional[Callable[[int], None]] = None,
) -> VersionManifest:
    """Fetch ``version`` (default newest) from the relay at ``address`` into the buffer ``alloc(manifest)`` returns
    (``total_bytes`` long, writable); ``alloc`` returning None drains the version through one chunk-sized scratch
    buffer (the caller holds it already). Every chunk is CRC-checked: a torn pull raises, never returns.
    ``on_chunk(index)`` runs after each chunk arrived whole."""
    ch = (transport or TcpTransport()).connect(address, timeout=timeout_s)
    try:
        ch.settimeout(timeout_s)
        ch.send(Frame(Kind.PULL, version=NEWEST if version is None else version))
        fr = ch.recv_header()
        if fr.kind == Kind.MISSING:
            raise VersionGoneError(f"relay at {address[0]}:{address[1]} has no version {version}")
        if fr.kind != Kind.BEGIN:
            raise TransportError(f"relay at {address} answered PULL with kind {fr.kind}")
        m = VersionManifest.from_json(ch.recv_payload(fr.length))
        buf = alloc(m)
        scratch = memoryview(bytearray(m.chunk_size)) if buf is None else None
        for i in range(m.num_chunks):
            fr = ch.recv_header()
            off, length = m.chunk_span(i)
            if fr.kind != Kind.CHUNK or fr.index != i or fr.length != length:
                raise TransportError(f"bad chunk frame {fr} for version {m.version} chunk {i}")
            dest = buf[off : off + length] if buf is not None else scratch[:length]
            ch.recv_payload_into(dest)
            if crc32(dest) != fr.crc:
                raise TornTransferError(f"pulled chunk {i} of version {m.version} failed its checksum")
            if on_chunk is not None:
                on_chunk(i)
        if ch.recv_header().kind != Kind.END:
            raise TransportError(f"pull of version {m.version} from {address} did not end with END")
        return m
    finally:
        ch.close()


def pull(
    address: tuple[str, int],
    version: Optional[int] = None,
    transport: Optional[Transport] = None,
    timeout_s: float = 60.0,
) -> tuple[VersionManifest, memoryview]:
    """Fetch ``version`` (default newest) from the relay at ``address`` into a private buffer.

    For tools and tests; a rollout worker whose relay died uses ``node_pull.pull_shared`` (one copy per machine).
    """
    bufs: list[memoryview] = []

    def alloc(m: VersionManifest) -> memoryview:
        bufs.append(memoryview(bytearray(m.total_bytes)))
        return bufs[0]

    m = pull_into(address, version, alloc, transport, timeout_s)
    return m, bufs[0]


class RelayClient:
    """A rollout's view of the relays: its local store first, its upstream neighbour when that relay is gone.

    ``plan`` and ``alive`` are callables so the client always sees the relay group's current view.
    """

    def __init__(
        self,
        relay_id: str,
        root: str,
        plan: Callable[[], ChainPlan],
        addresses: Callable[[], dict[str, tuple[str, int]]],
        local_alive: Callable[[], bool],
        transport: Optional[Transport] = None,
    ) -> None:
        self.relay_id = relay_id
        self.reader = StoreReader(root)
        self._plan = plan
        self._addresses = addresses
        self._local_alive = local_alive
        self._transport = transport or TcpTransport()
        self._original_plan: Optional[ChainPlan] = None

    def get(self, version: Optional[int] = None) -> tuple[VersionManifest, memoryview, str]:
        """(manifest, bytes, source relay id) of ``version`` (default: newest available anywhere near)."""
        plan = self._plan()
        if self.relay_id in plan.relays:
            self._original_plan = plan
        if self._local_alive():
            m, view = self.reader.open(version)
            return m, view, self.relay_id
        old = self._original_plan or plan
        if self.relay_id not in old.relays:
            raise VersionGoneError(f"relay {self.relay_id} was never in the chain {old.relays}; cannot fall back")
        src = fallback_source(old, self.relay_id, plan.relays)
        logger.info("relay %s is gone; pulling from its upstream %s", self.relay_id, src)
        m, view = pull(self._addresses()[src], version, self._transport)
        return m, view, src
