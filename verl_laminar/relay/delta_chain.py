"""A relay's side of delta versions (``laminar.relay.delta``): encode on the master, rebuild on every other relay.

Dataflow:
    master: published version n verified -> ``DeltaBook.encode`` against the newest version it holds (n-1) -> a
        delta file in the store's directory, cut into chunks and checksummed like a version -> kept as n's delta
    chain: the forwarder sends a version's kept (or in-flight) delta instead of its bytes: BEGIN carries a manifest
        whose bytes are the delta and whose ``delta`` field names the base and the target's manifest
    receiver: holds the base -> receives the delta into a staging file (chunk CRCs, forwarded downstream as its
        chunks arrive, as for a version) -> ``rebuild``: a copy of its base, the delta applied, every chunk checked
        against the master's CRCs (the digest) -> committed, readable; the delta kept for its own downstream.
        Lacks the base, or the digest does not match -> answers ``WHOLE`` and its upstream sends the whole version.

A delta file is never a readable version: it lives under a ``staging-`` name (a restarted relay drops it) and only
the rebuilt version is committed. Rollouts keep reading whole versions from the store.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
import uuid
from dataclasses import dataclass
from typing import Optional

from verl_laminar.relay import delta
from verl_laminar.relay.manifest import DeltaRef, VersionManifest
from verl_laminar.relay.store import (
    RelayStore,
    Staging,
    StoreReader,
    TornTransferError,
    VersionGoneError,
    _unlink,
)

logger = logging.getLogger(__name__)

DELTA_MODES = ("off", "auto")


class DigestMismatch(TornTransferError):
    """A version rebuilt from a delta does not match the master's digest; it is dropped, never readable."""


@dataclass(frozen=True)
class KeptDelta:
    manifest: VersionManifest  # the delta transfer's manifest, chunk CRCs included
    path: str


class DeltaBook:
    """A relay's delta mode, its newest delta (for its downstream) and its counters."""

    def __init__(self, mode: str, relay_id: str) -> None:
        if mode not in DELTA_MODES:
            raise ValueError(f"delta={mode!r} (laminar.relay.delta) must be one of {', '.join(DELTA_MODES)}")
        self.mode, self.relay_id = mode, relay_id
        self._lock = threading.Lock()
        self._kept: Optional[KeptDelta] = None
        # published_*: the master's choice per version; applied: versions rebuilt here from a delta;
        # fallback_*: why a whole version went instead (to this relay's downstream: no_base, or a failed delta push;
        # here: digest); bytes_*: what this relay sent downstream
        self.counts = {"published_delta": 0, "published_whole": 0, "applied": 0, "fallback_no_base": 0,
                       "fallback_digest": 0, "fallback_torn": 0, "bytes_delta_sent": 0, "bytes_whole_sent": 0}

    def count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.counts[key] += n

    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)

    def kept(self, version: int) -> Optional[KeptDelta]:
        with self._lock:
            k = self._kept
        return k if k is not None and k.manifest.version == version else None

    def keep(self, kept: Optional[KeptDelta]) -> None:
        """Keep ``kept`` as the newest delta (None: drop it); the one it replaces is unlinked (a forwarder still
        sending it holds its own handle)."""
        with self._lock:
            old, self._kept = self._kept, kept
        if old is not None and (kept is None or old.path != kept.path):
            _unlink(old.path)

    def encode(self, store: RelayStore, target: Staging, chunked) -> Optional[KeptDelta]:
        """The master's delta of the verified ``target`` against its newest readable version, or None when the
        whole version goes (mode off, no base, another layout, or not at most ``delta.MAX_DELTA_SHARE`` of it).
        ``chunked``: the relay's rule that cuts a manifest for the broadcast."""
        m = target.manifest
        base_v = store.newest()
        if self.mode != "auto" or base_v is None or base_v >= m.version:
            return None
        try:
            bm, base = StoreReader(store.root).open(base_v)
        except (OSError, VersionGoneError) as e:  # evicted or being recycled meanwhile: the whole version goes
            logger.info("relay %s: no base for a delta of version %d: %s", self.relay_id, m.version, e)
            return None
        path = os.path.join(store.root, f"staging-delta-{m.version:012d}-{uuid.uuid4().hex[:8]}.data")
        try:
            if bm.total_bytes != m.total_bytes or [(t.name, t.offset) for t in bm.tensors] != [
                    (t.name, t.offset) for t in m.tensors]:
                return None
            word = delta.word_size([t.dtype for t in m.tensors], m.total_bytes)
            with open(path, "wb") as fh:
                size = delta.encode(base, target.buffer, fh, word, int(delta.MAX_DELTA_SHARE * m.total_bytes))
        except OSError as e:  # a full /dev/shm: the whole version needs no extra room
            logger.warning("relay %s: delta of version %d not written (%s); sending it whole", self.relay_id,
                           m.version, e)
            size = None
        finally:
            base.release()
        if size is None:
            _unlink(path)
            return None
        ref = DeltaRef(base=base_v, target=m.with_checksums(target.checksums))
        dm = chunked(VersionManifest(version=m.version, total_bytes=size, chunk_size=max(1, size), delta=ref))
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_READ) as mm:
            crcs = delta.digest(mm, dm.chunk_size)
        logger.info("relay %s: version %d goes as a delta against %d (%d bytes, %.2f%% of the version)",
                    self.relay_id, m.version, base_v, size, 100.0 * size / max(1, m.total_bytes))
        return KeptDelta(dm.with_checksums(crcs), path)


def can_rebuild(store: RelayStore, m: VersionManifest) -> bool:
    """Whether this relay can rebuild ``m`` (a delta transfer): it holds the base and may hold two copies."""
    return m.delta is not None and store.keep >= 2 and m.delta.base in store.versions()


def rebuild(store: RelayStore, received: Staging) -> Staging:
    """The version the delta in ``received`` (fully received and verified) rebuilds from this store's base, verified
    against the master's digest, for the caller to commit (with its waiters' bookkeeping, in one step).

    Raises ``DigestMismatch`` when the result is not the master's version (nothing is kept then), and
    ``VersionGoneError`` when the base was evicted meanwhile."""
    ref = received.manifest.delta
    bm, base = StoreReader(store.root).open(ref.base)
    try:
        if bm.total_bytes != ref.target.total_bytes:
            raise DigestMismatch(f"base {ref.base} has {bm.total_bytes} bytes, version {ref.target.version} "
                                 f"{ref.target.total_bytes}")
        out = store.begin(ref.target)  # the master's CRCs ride in the manifest: verify() checks against them
        try:
            out.buffer[:] = base
            delta.apply(received.buffer, out.buffer)
            for i in range(ref.target.num_chunks):
                out.verify(i)
        except (TornTransferError, delta.DeltaError) as e:
            store.abort(out)
            raise DigestMismatch(f"version {ref.target.version} rebuilt from {ref.base}: {e}") from e
        except BaseException:
            store.abort(out)
            raise
        return out
    finally:
        base.release()
