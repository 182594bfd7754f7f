"""A version being written into a relay's store (``Staging``), and a committed version's writable mapping kept for
recycling its pages (``_Warm``); ``relay.store.RelayStore`` creates both. Split from the store so that each module
stays one responsibility: the store decides what is kept, this writes and verifies one copy."""

from __future__ import annotations

import fcntl
import logging
import mmap
import os
import uuid
from dataclasses import dataclass
from typing import Optional

from verl_laminar.relay.layout import KEEP_VERSIONS, TornTransferError, _reserve
from verl_laminar.relay.manifest import VersionManifest, crc32

logger = logging.getLogger(__name__)


class Staging:
    """A version being received or published; not readable until ``RelayStore.commit``.

    ``reserve=True`` allocates every page now (a publish: the trainer learns at once that memory is short).
    ``reserve=False`` leaves that to ``reserve(i)`` before chunk ``i`` is written (a receiver: allocating a whole
    version before answering its upstream would add that time to every hop of the chain).
    """

    def __init__(self, root: str, manifest: VersionManifest, spare: Optional[str] = None, reserve: bool = True,
                 keep: int = KEEP_VERSIONS, recycled: Optional["_Warm"] = None) -> None:
        self.manifest = manifest
        self.root, self._keep = root, keep
        self.path = os.path.join(root, f"staging-{manifest.version:012d}-{uuid.uuid4().hex[:8]}.data")
        size = manifest.total_bytes
        self.recycled = recycled is not None
        self._map: mmap.mmap | bytes
        if recycled is not None:  # an evicted version's file, exclusively locked: its pages are allocated and mapped
            os.replace(recycled.path, self.path)
            self._fd, self._map = recycled.fd, recycled.map
            reserved = True
        elif spare is not None:  # pre-allocated pages: writing into them costs no page faults
            os.replace(spare, self.path)
            self._fd = os.open(self.path, os.O_RDWR)
            if os.fstat(self._fd).st_size != size:
                os.ftruncate(self._fd, size)
            reserved = True
        else:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.ftruncate(self._fd, size)
                if reserve and size:
                    _reserve(self._fd, 0, size, root, keep, f"version {manifest.version}")
            except BaseException:
                os.close(self._fd)
                os.unlink(self.path)
                raise
            reserved = reserve
        if recycled is None:
            self._map = mmap.mmap(self._fd, size, access=mmap.ACCESS_WRITE) if size else b""
        self.buffer = memoryview(self._map) if size else memoryview(bytearray(0))
        n = manifest.num_chunks
        self._reserved = [reserved] * n
        self.checksums: list[Optional[int]] = list(manifest.checksums) if manifest.checksums else [None] * n
        self.verified = [False] * n
        self.aborted = False

    def reserve(self, i: int) -> None:
        """Allocate chunk ``i``'s pages before it is written through the mapping (no-op once allocated)."""
        if self._reserved[i]:
            return
        off, length = self.manifest.chunk_span(i)
        if length:
            _reserve(self._fd, off, length, self.root, self._keep, f"chunk {i} of version {self.manifest.version}")
        self._reserved[i] = True

    def chunk(self, i: int) -> memoryview:
        off, length = self.manifest.chunk_span(i)
        return self.buffer[off : off + length]

    def verify(self, i: int, expected: Optional[int] = None) -> int:
        """Check chunk ``i`` against ``expected`` (or record its CRC when the source is trusted)."""
        got = crc32(self.chunk(i))
        want = expected if expected is not None else self.checksums[i]
        if want is not None and got != want:
            raise TornTransferError(
                f"chunk {i} of version {self.manifest.version} has crc {got:#010x}, expected {want:#010x}"
            )
        self.checksums[i] = got
        self.verified[i] = True
        return got

    @property
    def complete(self) -> bool:
        return all(self.verified)

    def detach(self) -> Optional["_Warm"]:
        """Hand this staging's descriptor and mapping over (to stay warm for recycling) instead of closing them."""
        if not isinstance(self._map, mmap.mmap) or self._fd < 0:
            self.close()
            return None
        self.buffer.release()
        if self.recycled:
            fcntl.flock(self._fd, fcntl.LOCK_UN)  # readable again once committed
        warm = _Warm(self._fd, self._map, self.path, self.manifest.total_bytes)
        self._fd, self._map = -1, b""
        return warm

    def close(self) -> None:
        self.buffer.release()
        if isinstance(self._map, mmap.mmap):
            try:
                self._map.close()
            except BufferError:  # a chunk view is still referenced; the mapping goes with it
                logger.debug("staging %s still has chunk views; unmapping on release", self.path)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


@dataclass
class _Warm:
    """A committed version's open descriptor and writable mapping, kept so its pages can become the next staging."""

    fd: int
    map: mmap.mmap
    path: str
    size: int

    def close(self) -> None:
        try:
            self.map.close()
        except BufferError:  # a view of it is still referenced; the mapping goes with that view
            logger.debug("warm mapping of %s still has views", self.path)
        os.close(self.fd)

    def try_lock(self) -> bool:
        """The exclusive lock, without waiting: True only when no reader holds a lease on this file."""
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False
