"""Host shared-memory store of weight versions held by one relay.

Dataflow: ``begin`` -> a ``Staging`` file (tmpfs, mapped) that the network receiver or the local
publisher fills chunk by chunk -> ``Staging.verify(i, crc)`` per chunk -> ``commit`` renames it to
``v<version>.data`` and only then writes ``v<version>.json`` (the manifest with every checksum).
A version is readable exactly when its ``.json`` exists, so a torn or corrupted transfer is never
readable. The store keeps the newest complete version and the one before it; older ones are
unlinked, which leaves any reader's existing mapping valid (POSIX unlink semantics).

``StoreReader`` is what a rollout on the same machine uses: it lists readable versions and maps one
read-only, with no copy through Ray's object store.
"""

from __future__ import annotations

import logging
import mmap
import os
import re
import tempfile
import threading
import uuid
from dataclasses import dataclass
from typing import Optional

from verl_laminar.relay.manifest import VersionManifest, crc32

logger = logging.getLogger(__name__)

_VERSION_FILE = re.compile(r"^v(\d{12})\.json$")
KEEP_VERSIONS = 2  # newest complete version + the previous one


class TornTransferError(RuntimeError):
    """A chunk failed its checksum or a version was committed with chunks missing."""


class VersionGoneError(LookupError):
    """The requested version is not (or no longer) readable in this store."""


def default_store_root(relay_id: str) -> str:
    """``/dev/shm/laminar-relay/<relay_id>`` when tmpfs shared memory exists, else the temp dir."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    return os.path.join(base, "laminar-relay", relay_id)


def _data_path(root: str, version: int) -> str:
    return os.path.join(root, f"v{version:012d}.data")


def _json_path(root: str, version: int) -> str:
    return os.path.join(root, f"v{version:012d}.json")


def _map(path: str, size: int, writable: bool) -> mmap.mmap | bytes:
    if size == 0:
        return b""
    fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
    try:
        return mmap.mmap(fd, size, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
    finally:
        os.close(fd)


class Staging:
    """A version being received or published; not readable until ``RelayStore.commit``."""

    def __init__(self, root: str, manifest: VersionManifest, spare: Optional[str] = None) -> None:
        self.manifest = manifest
        self.path = os.path.join(root, f"staging-{manifest.version:012d}-{uuid.uuid4().hex[:8]}.data")
        if spare is not None:  # pre-allocated pages: writing into them costs no page faults
            os.replace(spare, self.path)
            if os.path.getsize(self.path) != manifest.total_bytes:
                os.truncate(self.path, manifest.total_bytes)
        else:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.ftruncate(fd, manifest.total_bytes)
            finally:
                os.close(fd)
        self._map = _map(self.path, manifest.total_bytes, writable=True)
        self.buffer = memoryview(self._map) if manifest.total_bytes else memoryview(bytearray(0))
        n = manifest.num_chunks
        self.checksums: list[Optional[int]] = list(manifest.checksums) if manifest.checksums else [None] * n
        self.verified = [False] * n
        self.aborted = False

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

    def close(self) -> None:
        self.buffer.release()
        if isinstance(self._map, mmap.mmap):
            try:
                self._map.close()
            except BufferError:  # a chunk view is still referenced; the mapping goes with it
                logger.debug("staging %s still has chunk views; unmapping on release", self.path)


@dataclass(frozen=True)
class StoredVersion:
    manifest: VersionManifest
    path: str  # the data file; map it read-only


class RelayStore:
    """The relay's versions in host shared memory (one directory of tmpfs files)."""

    def __init__(self, root: str, keep: int = KEEP_VERSIONS) -> None:
        if keep < 1:
            raise ValueError(f"keep={keep!r} must be >= 1 (store at least the newest version)")
        self.root = root
        self.keep = keep
        self._lock = threading.Lock()
        os.makedirs(root, exist_ok=True)
        for name in os.listdir(root):  # a restarted relay drops torn leftovers, keeps complete versions
            if name.startswith("staging-") or name.endswith(".tmp"):
                os.unlink(os.path.join(root, name))
        self._versions: dict[int, StoredVersion] = {}
        self._spares: dict[int, str] = {}  # size -> pre-allocated staging file
        self._spare_lock = threading.Lock()
        for v in StoreReader(root).versions():
            self._versions[v] = StoredVersion(StoreReader(root).manifest(v), _data_path(root, v))
        self._evict()

    def begin(self, manifest: VersionManifest, spare: Optional[str] = None) -> Staging:
        """A new staging area; ``spare`` (a path from ``preallocate``) is reused, bytes already in it kept."""
        if spare is not None:
            with self._lock:
                size = next((n for n, p in self._spares.items() if p == spare), None)
                if size is None or size < manifest.total_bytes:
                    raise VersionGoneError(
                        f"{spare} is not a spare buffer of at least {manifest.total_bytes} bytes in {self.root}; "
                        "call prepare_publish again")
                del self._spares[size]
        return Staging(self.root, manifest, spare)

    def preallocate(self, nbytes: int) -> Optional[str]:
        """Path of a spare staging file of ``nbytes`` with its pages allocated (created if missing)."""
        if nbytes <= 0:
            return None
        with self._spare_lock:
            with self._lock:
                if nbytes in self._spares:
                    return self._spares[nbytes]
            path = os.path.join(self.root, f"staging-spare-{uuid.uuid4().hex[:8]}.data")
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.posix_fallocate(fd, 0, nbytes)
            finally:
                os.close(fd)
            with self._lock:
                self._spares[nbytes] = path
            return path

    def commit(self, staging: Staging) -> StoredVersion:
        """Make ``staging`` readable; raises ``TornTransferError`` unless every chunk verified."""
        m = staging.manifest
        if staging.aborted or not staging.complete:
            missing = [i for i, ok in enumerate(staging.verified) if not ok]
            raise TornTransferError(
                f"version {m.version} cannot be committed: chunks {missing[:8]} not verified (aborted={staging.aborted})"
            )
        final = m.with_checksums(staging.checksums)
        staging.close()
        data = _data_path(self.root, m.version)
        with self._lock:
            os.replace(staging.path, data)
            tmp = _json_path(self.root, m.version) + ".tmp"
            with open(tmp, "w") as f:
                f.write(final.to_json())
            os.replace(tmp, _json_path(self.root, m.version))
            stored = StoredVersion(final, data)
            self._versions[m.version] = stored
            self._evict()
        logger.debug("relay store %s committed version %d (%d bytes)", self.root, m.version, m.total_bytes)
        return stored

    def abort(self, staging: Staging) -> None:
        """Drop a torn transfer; the readable versions are untouched."""
        staging.aborted = True
        staging.close()
        try:
            os.unlink(staging.path)
        except FileNotFoundError:
            pass

    def _evict(self) -> None:
        for v in sorted(self._versions)[: -self.keep]:
            del self._versions[v]
            for p in (_json_path(self.root, v), _data_path(self.root, v)):
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass

    def newest(self) -> Optional[int]:
        with self._lock:
            return max(self._versions) if self._versions else None

    def versions(self) -> list[int]:
        with self._lock:
            return sorted(self._versions)

    def get(self, version: Optional[int] = None) -> StoredVersion:
        with self._lock:
            if not self._versions:
                raise VersionGoneError(f"relay store {self.root} holds no complete version yet")
            v = max(self._versions) if version is None else version
            if v not in self._versions:
                raise VersionGoneError(
                    f"version {v} is not readable in {self.root}; readable: {sorted(self._versions)}"
                )
            return self._versions[v]

    def destroy(self) -> None:
        """Remove every file of this store (clean shutdown)."""
        with self._lock:
            for name in os.listdir(self.root):
                os.unlink(os.path.join(self.root, name))
            os.rmdir(self.root)
            self._versions.clear()
        try:  # the shared parent (default_store_root) goes with its last relay
            os.rmdir(os.path.dirname(self.root))
        except OSError:
            pass


class StoreReader:
    """Read-only view of a relay store directory, for rollouts on the same machine."""

    def __init__(self, root: str) -> None:
        self.root = root

    def versions(self) -> list[int]:
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for m in map(_VERSION_FILE.match, names) if m)

    def newest(self) -> Optional[int]:
        vs = self.versions()
        return vs[-1] if vs else None

    def manifest(self, version: int) -> VersionManifest:
        try:
            with open(_json_path(self.root, version)) as f:
                return VersionManifest.from_json(f.read())
        except FileNotFoundError:
            raise VersionGoneError(f"version {version} is not readable in {self.root}") from None

    def open(self, version: Optional[int] = None) -> tuple[VersionManifest, memoryview]:
        """Map ``version`` (default newest) read-only; the mapping stays valid after eviction."""
        v = self.newest() if version is None else version
        if v is None:
            raise VersionGoneError(f"no complete version in {self.root} yet")
        m = self.manifest(v)
        try:
            mapped = _map(_data_path(self.root, v), m.total_bytes, writable=False)
        except FileNotFoundError:
            raise VersionGoneError(f"version {v} was evicted from {self.root}; read the newest") from None
        return m, memoryview(mapped)
