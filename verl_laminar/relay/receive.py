"""A relay's receive path: one version (or one delta) from its upstream, chunk by chunk, into the store.

Dataflow: BEGIN (manifest) -> SKIP (held already) | WHOLE (a delta whose base is not here: send the version) |
ACCEPT -> CHUNK x c into a staging file, CRCs on a verifier thread, each verified chunk ready for the forwarder ->
END -> commit (a delta: rebuild the version from the base, check the master's digest) -> END back to the upstream,
or WHOLE when the rebuilt version did not match (the upstream then sends the whole version). Split from ``relay``
so that the relay class stays its control surface.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

from verl_laminar.relay.delta_chain import DeltaBook, DigestMismatch, can_rebuild
from verl_laminar.relay.inflight import InFlight
from verl_laminar.relay.manifest import VersionManifest
from verl_laminar.relay.store import RelayMemoryError, RelayStore, Staging, TornTransferError, VersionGoneError
from verl_laminar.relay.transport import Channel, Frame, Kind, TransportError
from verl_laminar.relay.verify import ChunkVerifier

logger = logging.getLogger(__name__)


class Receiver(Protocol):
    """What the receive path uses of the relay it receives for (``relay.Relay`` is one): its store and counters,
    its condition guarding its in-flight versions, and its commit."""

    relay_id: str
    store: RelayStore
    deltas: DeltaBook
    verify_inline: bool
    _closed: bool
    _cond: threading.Condition
    _inflight: dict[int, InFlight]

    def _supersede(self, version: int) -> None: ...

    def _memory_failure(self, version: int, err: RelayMemoryError) -> None: ...

    def _commit(self, f: InFlight) -> None: ...


def _begin(relay: Receiver, ch: Channel, m: VersionManifest):
    """The staging copy of ``m`` (``None``: answered already); called with the relay's condition held."""
    newest = relay.store.newest()
    if newest is not None and m.version <= newest:
        ch.send(Frame(Kind.SKIP, version=m.version))
        return None
    if m.delta is not None and not can_rebuild(relay.store, m):
        relay.deltas.count("fallback_no_base")
        logger.info("relay %s: no base %d for the delta of version %d; asking for the whole version",
                    relay.relay_id, m.delta.base, m.version)
        ch.send(Frame(Kind.WHOLE, version=m.version))
        return None
    relay._supersede(m.version)
    try:  # pages are reserved chunk by chunk below, so the upstream is answered without that delay
        if m.delta is not None:  # a delta is no copy of the model: outside the store's count, never committed as is
            return Staging(relay.store.root, m, reserve=False, keep=relay.store.keep)
        return relay.store.begin(m, reserve=False)
    except RelayMemoryError as e:
        relay._memory_failure(m.version, e)
        return None  # closing the connection makes the upstream retry: a transient shortage heals


def receive(relay: Receiver, ch: Channel, m: VersionManifest) -> None:
    with relay._cond:
        staging = _begin(relay, ch, m)
        if staging is None:
            return
        f = InFlight(staging, relay._cond, source=ch.peer)
        f.channel = ch
        relay._inflight[m.version] = f
    verifier = None
    try:
        if ch.one_sided:  # the peer writes into these pages directly: they must exist first (never a SIGBUS)
            for i in range(m.num_chunks):
                staging.reserve(i)
        ch.send(Frame(Kind.ACCEPT, version=m.version), ch.expose(staging.buffer))
        # CRCs on their own thread: the next chunk's bytes arrive while this one's checksum is computed
        verifier = None if relay.verify_inline else ChunkVerifier(f, f"relay-{relay.relay_id}-verify")
        for i in range(m.num_chunks):
            fr = ch.recv_header()
            if fr.kind != Kind.CHUNK or fr.version != m.version:
                raise TransportError(f"expected CHUNK of version {m.version}, got kind {fr.kind} v{fr.version}")
            f.staging.reserve(fr.index)
            view = f.staging.chunk(fr.index)
            if fr.length != len(view):
                raise TornTransferError(f"chunk {fr.index} is {fr.length} bytes, expected {len(view)}")
            try:
                ch.recv_payload_into(view)
            finally:
                view.release()
            if verifier is None:
                f.mark_ready(fr.index, f.staging.verify(fr.index, fr.crc))
            else:
                verifier.submit(fr.index, fr.crc)
        if ch.recv_header().kind != Kind.END:
            raise TransportError(f"version {m.version} from {ch.peer} did not end with END")
        if verifier is not None:
            verifier.finish()  # raises the first chunk's TornTransferError
        try:
            relay._commit(f)
        except (DigestMismatch, VersionGoneError) as e:  # never readable: the upstream sends the whole version
            relay.deltas.count("fallback_digest")
            logger.warning("relay %s: version %d not rebuilt from its delta (%s); asking for the whole version",
                           relay.relay_id, m.version, e)
            ch.send(Frame(Kind.WHOLE, version=m.version))
            raise TornTransferError(str(e)) from e
        ch.send(Frame(Kind.END, version=m.version))
        if m.delta is not None:  # the delta's pages stay as a file for the downstream; the mapping goes, after a
            ch.close()  # one-sided transport stopped accepting writes into it (a version's mapping stays warm instead)
            staging.close()
    except (TransportError, TornTransferError, RelayMemoryError, IndexError, ValueError) as e:
        if verifier is not None:
            verifier.stop()
        ch.close()  # a one-sided transport stops accepting writes into the staging pages before they go
        if isinstance(e, RelayMemoryError):
            relay._memory_failure(m.version, e)
        else:
            log = logger.debug if relay._closed else logger.warning
            log("relay %s: version %d from %s torn: %s", relay.relay_id, m.version, ch.peer, e)
        with relay._cond:
            if relay._inflight.get(m.version) is f:
                del relay._inflight[m.version]
        f.fail()
        relay.store.abort(f.staging)
