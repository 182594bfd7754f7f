"""The on-disk layout of a relay store, and what a reader needs of it (no writer state).

A store directory holds ``v<version>.data`` (the weight bytes) and ``v<version>.json`` (its manifest); a version is
readable exactly when its ``.json`` exists. ``StoreReader`` is what a rollout on the same machine uses: it lists
readable versions and maps one read-only, holding a shared ``flock`` (``lease``) so the writer never recycles those
pages under it. The writer, ``store.RelayStore``, lives beside this module.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import re
from typing import Optional

from verl_laminar.platform.shm_cleanup import relay_store_base
from verl_laminar.relay.manifest import VersionManifest

_VERSION_FILE = re.compile(r"^v(\d{12})\.json$")
KEEP_VERSIONS = 2  # laminar.relay.keep_versions default: the newest version stays readable while the next arrives


class TornTransferError(RuntimeError):
    """A chunk failed its checksum or a version was committed with chunks missing."""


class VersionGoneError(LookupError):
    """The requested version is not (or no longer) readable in this store."""


class RelayMemoryError(MemoryError):
    """The store's filesystem (``/dev/shm``) has too little free space for a version; the message names the fixes.

    A ``MemoryError``, not an ``OSError``: callers take an ``OSError`` from a relay handle for the relay being
    gone (``publish.RelayGoneError`` is a ``ConnectionError``) and fail over, which cannot help here.
    """

    def __init__(self, needed: int, free: int, path: str, keep: int, what: str = "a version") -> None:
        self.needed, self.free, self.path, self.keep, self.what = int(needed), int(free), path, int(keep), what
        super().__init__(
            f"relay store {path} needs {self.needed} bytes ({self.needed / 2**30:.2f} GiB) of host shared memory for "
            f"{what}, but its filesystem has {self.free} bytes ({self.free / 2**30:.2f} GiB) free. Enlarge /dev/shm "
            "(docker run --shm-size=<size>; Kubernetes: an emptyDir volume with medium: Memory and a sizeLimit mounted "
            f"at /dev/shm) or lower laminar.relay.keep_versions (now {self.keep}; each is one full copy of the model "
            "on every rollout node, see verl_laminar.policy.relay_memory.relay_host_bytes)")

    def __reduce__(self):  # Ray rebuilds raised errors from these arguments, not from the message
        return type(self), (self.needed, self.free, self.path, self.keep, self.what)


def default_store_root(relay_id: str) -> str:
    """``/dev/shm/laminar-relay/<relay_id>`` when tmpfs shared memory exists, else the temp dir."""
    return os.path.join(relay_store_base(), relay_id)


def _data_path(root: str, version: int) -> str:
    return os.path.join(root, f"v{version:012d}.data")


def _json_path(root: str, version: int) -> str:
    return os.path.join(root, f"v{version:012d}.json")


def lease(fd: int, path: str) -> None:
    """Take a reader's shared lock on the data file open at ``fd`` (``path``): while it is held the store never
    recycles that file. Raises ``VersionGoneError`` when the store holds the file for recycling, or when ``path``
    no longer names it (recycled meanwhile). The lock lives as long as any descriptor of this open file does,
    so a mapping made from ``fd`` (which keeps a duplicate) holds it until the mapping is closed."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        same = os.stat(path).st_ino == os.fstat(fd).st_ino
    except (BlockingIOError, FileNotFoundError):
        same = False
    if not same:
        raise VersionGoneError(f"{path} was evicted and is being reused; read the newest version")


def _map(path: str, size: int, writable: bool) -> mmap.mmap | bytes:
    if size == 0:
        return b""
    fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
    try:
        if not writable:
            lease(fd, path)
        return mmap.mmap(fd, size, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
    finally:
        os.close(fd)


def free_bytes(path: str) -> int:
    """Bytes an unprivileged writer may still allocate on ``path``'s filesystem."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def ensure_free(root: str, needed: int, keep: int, what: str) -> None:
    """Raise ``RelayMemoryError`` unless ``needed`` bytes are free where ``root`` lives."""
    free = free_bytes(root)
    if needed > free:
        raise RelayMemoryError(needed, free, root, keep, what)


def _reserve(fd: int, offset: int, length: int, root: str, keep: int, what: str) -> None:
    """Allocate the pages of ``[offset, offset + length)``; ENOSPC (a full tmpfs) becomes ``RelayMemoryError``."""
    try:
        os.posix_fallocate(fd, offset, length)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise RelayMemoryError(length, free_bytes(root), root, keep, what) from e
        raise


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
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
