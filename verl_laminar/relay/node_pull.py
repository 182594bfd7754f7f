"""The relay-death fallback of a machine: one pulled copy in shared memory for all its rollout workers.

When a machine's relay dies, each of its rollout workers (one per tensor-parallel rank, 8 with TP=8) must still
read the version. Pulling it into each worker's private memory would hold TP copies of the model on the machine
(8 x 145 GB at 72B) and move TP times the bytes over the network. Instead:

    pull_shared(address, version, root)
      -> exclusive lock on ``root/.lock`` (one puller per machine; the others wait on the lock)
      -> ``root`` holds the version already (another worker pulled it): map it read-only, done
      -> else reserve its pages (a short /dev/shm raises ``RelayMemoryError``), stream every chunk from the upstream
         relay straight into a mapping of a hidden file (CRC-checked), rename it to ``v<version>.data`` and write its
         manifest last, so a torn pull is never readable; older pulled versions are unlinked (a worker still
         mapping one keeps its pages)
      -> map it read-only (``layout.StoreReader``, the same reader as a live relay's store) before the lock is
         released

``root`` sits beside the relay stores (``shared_pull_root``) and is locked like one while a pull runs, so the
start-of-run sweep of dead relays' stores removes what a previous run pulled.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import mmap
import os
import time
from typing import Iterator, Optional

from verl_laminar.platform.shm_cleanup import LOCK_FILE, relay_store_base
from verl_laminar.relay.client import pull_into
from verl_laminar.relay.layout import StoreReader, _data_path, _json_path, _reserve, _unlink, ensure_free
from verl_laminar.relay.manifest import VersionManifest
from verl_laminar.relay.transport import Transport

logger = logging.getLogger(__name__)

PULLED_SUFFIX = ".pulled"
KEEP_PULLED = 2  # the newest pulled version stays readable while the next one is pulled


def shared_pull_root(relay_id: str, base: Optional[str] = None) -> str:
    """Where the workers of dead relay ``relay_id``'s machine share what they pull."""
    return os.path.join(base or relay_store_base(), f"{relay_id}{PULLED_SUFFIX}")


def _pull_progress(root: str) -> tuple:
    """What changes while the holder of ``root``'s lock pulls: its hidden file's name and the time of its last
    chunk (the sink touches it after each one; its pages were reserved up front, so its size says nothing)."""
    marks = []
    with contextlib.suppress(FileNotFoundError):
        for name in sorted(os.listdir(root)):
            if name.startswith(".v") and ".partial-" in name:
                with contextlib.suppress(FileNotFoundError):
                    marks.append((name, os.stat(os.path.join(root, name)).st_mtime_ns))
    return tuple(marks)


@contextlib.contextmanager
def node_lock(root: str, timeout_s: float, poll_s: float = 0.05) -> Iterator[None]:
    """Hold ``root``'s exclusive lock; raises ``TimeoutError`` after ``timeout_s`` without it and without progress.

    The holder may be pulling a large version for minutes: the wait goes on while chunks arrive, and fails after
    ``timeout_s`` without one, as a pull's own read would.
    """
    os.makedirs(root, exist_ok=True)
    fd = os.open(os.path.join(root, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        seen, since = _pull_progress(root), time.monotonic()
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                now, progress = time.monotonic(), _pull_progress(root)
                if progress != seen:
                    seen, since = progress, now
                elif now - since > timeout_s:
                    raise TimeoutError(f"another worker held {root} for {timeout_s:.0f} s without progress (a pull "
                                       "of the fallback version that stalled)") from None
                time.sleep(poll_s)
        yield
    finally:
        os.close(fd)  # releases the lock


def _evict(root: str, keep: int) -> list[int]:
    """Unlink all but the newest ``keep`` pulled versions (manifest first: a version is gone once it is unreadable)."""
    versions = StoreReader(root).versions()
    old = versions[: max(0, len(versions) - keep)]
    for v in old:
        _unlink(_json_path(root, v))
        _unlink(_data_path(root, v))
    return old


class _FileSink:
    """The buffer ``pull_into`` fills: a hidden, reserved file in ``root`` mapped writable (no private memory)."""

    def __init__(self, root: str, have: set[int], keep: int) -> None:
        self.root, self.have, self.keep = root, have, keep
        self.path: Optional[str] = None
        self.mapping: Optional[mmap.mmap] = None

    def __call__(self, m: VersionManifest) -> Optional[memoryview]:
        if m.version in self.have:  # asked for the newest, which a worker pulled already
            return None
        _evict(self.root, self.keep - 1)
        what = f"version {m.version} pulled after its relay died"
        ensure_free(self.root, m.total_bytes, self.keep, what)
        self.path = os.path.join(self.root, f".v{m.version:012d}.partial-{os.getpid()}")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            if m.total_bytes:
                _reserve(fd, 0, m.total_bytes, self.root, self.keep, what)
                self.mapping = mmap.mmap(fd, m.total_bytes, access=mmap.ACCESS_WRITE)
        finally:
            os.close(fd)
        return memoryview(self.mapping) if self.mapping is not None else memoryview(bytearray(0))

    def chunk_arrived(self, index: int) -> None:
        """Tell the workers waiting on the lock that the pull moves (``node_lock`` watches this file's time)."""
        if self.path is not None:
            os.utime(self.path)

    def commit(self, m: VersionManifest) -> None:
        if self.path is None:
            return
        if self.mapping is not None:
            self.mapping.close()
            self.mapping = None
        os.rename(self.path, _data_path(self.root, m.version))
        tmp = _json_path(self.root, m.version) + ".tmp"
        with open(tmp, "w") as f:
            f.write(m.to_json())
        os.rename(tmp, _json_path(self.root, m.version))  # readable from here on
        self.path = None

    def discard(self) -> None:
        if self.mapping is not None:
            with contextlib.suppress(BufferError):
                self.mapping.close()
            self.mapping = None
        if self.path is not None:
            _unlink(self.path)
            self.path = None


def pull_shared(address: tuple[str, int], version: Optional[int], root: str, transport: Optional[Transport] = None,
                timeout_s: float = 60.0, keep: int = KEEP_PULLED) -> tuple[VersionManifest, memoryview]:
    """``version`` (default newest) of the relay at ``address``, read-only from this machine's shared copy.

    Pulled over the network only by the first worker of the machine to ask for it; the others map that copy.
    """
    if keep < 1:
        raise ValueError(f"keep={keep} must be >= 1 (the version being read)")
    reader = StoreReader(root)
    with node_lock(root, timeout_s):
        have = set(reader.versions())
        if version is not None and int(version) in have:
            return reader.open(int(version))
        sink = _FileSink(root, have, keep)
        try:
            m = pull_into(address, version, sink, transport, timeout_s, on_chunk=sink.chunk_arrived)
            sink.commit(m)
        finally:
            sink.discard()  # a failed pull leaves nothing behind; after a commit there is nothing to discard
        logger.info("pulled version %d (%d bytes) from %s:%d into %s for this machine's workers", m.version,
                    m.total_bytes, address[0], address[1], root)
        return reader.open(m.version)
