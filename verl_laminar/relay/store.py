"""Host shared-memory store of weight versions held by one relay.

Dataflow: ``begin`` -> a ``Staging`` file (tmpfs, mapped) that the network receiver or the local
publisher fills chunk by chunk -> ``Staging.verify(i, crc)`` per chunk -> ``commit`` renames it to
``v<version>.data`` and only then writes ``v<version>.json`` (the manifest with every checksum).
A version is readable exactly when its ``.json`` exists, so a torn or corrupted transfer is never
readable.

Memory: ``keep`` (``laminar.relay.keep_versions``) bounds the full copies of the model the store holds,
the one being received included. ``begin`` evicts committed versions down to ``keep - 1`` before it
reserves the staging copy; ``commit`` keeps the ``keep`` newest, so the previous version stays readable
until the next staging begins (``policy/relay_memory.py`` gives the per-node total). With ``keep == 1``
even the newest version is evicted when the next one starts arriving: the key is a memory cap, and
whoever sets 1 cannot hold two copies. A ``hold`` keeps one older version beyond the bound (one more copy, taken
only when the filesystem has room for it) while a dead replica's groups wait for a replacement to load it
(``rollout.router_failover``). Loads already in progress keep their mapping, new loads wait for
the commit (the router waits for it anyway), a downstream relay gets the version in flight.
Eviction unlinks files, which leaves existing mappings and open handles valid (POSIX): their pages
stay allocated until the last one goes, a transient beyond the bound.

Recycling: a receiving relay that evicts a version of the size it is about to receive reuses that file's pages
(and its mapping) as the new staging copy instead of unlinking it and zero-filling fresh pages, which is most of
what receiving into host memory costs. Readers hold a shared ``flock`` on a version's data file for as long as
their mapping lives (``StoreReader.open``); the store recycles a file only when it gets the exclusive lock without
waiting, so no mapped version's bytes are ever overwritten. A reader that finds the lock taken, or finds the path
no longer naming the file it locked, gets ``VersionGoneError`` (the version was evicted), as before.

Staging pages are reserved with ``posix_fallocate`` after a free-space check, before anything is
written through the mapping, so a full tmpfs is a ``RelayMemoryError`` that names the fix instead of
a SIGBUS killing the relay on a write to an unbacked page.

Ownership: a store holds an ``flock`` on ``<root>/.lock`` for its lifetime; the kernel releases it when the
process dies, however it dies, so ``remove_unused_store`` removes exactly the stores of relays that are gone.

``StoreReader`` (in ``layout``, with the file names and errors) is what a rollout on the same machine uses: it lists
readable versions and maps one read-only, with no copy through Ray's object store. ``Staging`` (one copy being
written) and the warm mappings kept for recycling are in ``staging``.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from dataclasses import dataclass
from typing import Optional

from verl_laminar.platform.shm_cleanup import acquire_store, bury_store
from verl_laminar.relay.layout import (  # noqa: F401  (re-exported: the store's errors and reader live there)
    KEEP_VERSIONS,
    RelayMemoryError,
    StoreReader,
    TornTransferError,
    VersionGoneError,
    _data_path,
    _json_path,
    _reserve,
    _unlink,
    default_store_root,
    ensure_free,
    free_bytes,
    lease,
)
from verl_laminar.relay.manifest import VersionManifest
from verl_laminar.relay.staging import Staging, _Warm  # noqa: F401  (Staging re-exported)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoredVersion:
    manifest: VersionManifest
    path: str  # the data file; map it read-only


class RelayStore:
    """The relay's versions in host shared memory (one directory of tmpfs files)."""

    def __init__(self, root: str, keep: int = KEEP_VERSIONS, lock_timeout_s: float = 10.0, recycle: bool = True) -> None:
        """``recycle=False``: evicted versions are always unlinked and every staging copy gets fresh pages (the
        store before recycling existed; benchmarks measure both)."""
        if int(keep) != keep or keep < 1:
            raise ValueError(f"keep={keep!r} (laminar.relay.keep_versions) must be an integer >= 1: the copies of "
                             "the model this relay may hold, the one being received included")
        self.root = root
        self.keep = int(keep)
        self.recycle = recycle
        self._lock = threading.Lock()
        self._owner = acquire_store(root, lock_timeout_s)  # held for the store's life: sweeps leave it alone
        for name in os.listdir(root):  # a restarted relay drops torn leftovers, keeps complete versions
            if name.startswith("staging-") or name.endswith(".tmp"):
                os.unlink(os.path.join(root, name))
        self._versions: dict[int, StoredVersion] = {}
        self._spares: dict[int, str] = {}  # size -> pre-allocated staging file (at most one)
        self._warm: dict[int, _Warm] = {}  # committed version -> its mapping, for recycling at eviction
        # versions kept beyond ``keep`` until released: a dead replica's groups wait for a replacement to load theirs
        self._held: dict[int, int] = {}  # version -> holds not yet released (the router's and each load's)
        self._spare_lock = threading.Lock()
        for v in StoreReader(root).versions():
            self._versions[v] = StoredVersion(StoreReader(root).manifest(v), _data_path(root, v))
        self._evict(self.keep)

    def begin(self, manifest: VersionManifest, spare: Optional[str] = None, reserve: bool = True) -> Staging:
        """A new staging area, after evicting committed versions down to ``keep - 1`` (it counts as a copy).

        ``spare`` (a path from ``preallocate``) is reused, bytes already in it kept. ``reserve=False``: only the
        free-space check happens here and the caller reserves each chunk (``Staging.reserve``) before writing it.
        Raises ``RelayMemoryError`` when the filesystem cannot hold the version.
        """
        with self._lock:
            if spare is not None:
                size = next((n for n, p in self._spares.items() if p == spare), None)
                if size is None or size < manifest.total_bytes:
                    raise VersionGoneError(
                        f"{spare} is not a spare buffer of at least {manifest.total_bytes} bytes in {self.root}; "
                        "call prepare_publish again")
                del self._spares[size]
            want = (manifest.total_bytes if spare is None else size) if self.recycle else None
            recycled = self._evict(self.keep - 1, recycle_size=want)
            if recycled is not None and spare is not None:
                # a publish: the evicted version's pages become the next publish's spare, so the spare the relay
                # prepares after this publish is already there (no fresh pages to zero while the chain runs)
                self._recycle_as_spare(recycled, size)
                recycled = None
        if recycled is not None:
            logger.debug("relay store %s receives version %d into recycled pages", self.root, manifest.version)
            try:
                return Staging(self.root, manifest, reserve=reserve, keep=self.keep, recycled=recycled)
            except BaseException:
                recycled.close()
                _unlink(recycled.path)
                raise
        if spare is None:
            ensure_free(self.root, manifest.total_bytes, self.keep, f"version {manifest.version}")
        return Staging(self.root, manifest, spare, reserve=reserve, keep=self.keep)

    def preallocate(self, nbytes: int) -> Optional[str]:
        """Path of a spare staging file of ``nbytes`` with its pages allocated (created if missing).

        One spare at a time (the master's memory budget counts one): a spare of another size is dropped.
        Raises ``RelayMemoryError`` when the filesystem cannot hold it.
        """
        if nbytes <= 0:
            return None
        with self._spare_lock:
            with self._lock:
                if nbytes in self._spares:
                    return self._spares[nbytes]
                stale, self._spares = list(self._spares.values()), {}
            for p in stale:
                _unlink(p)
            what = "the spare buffer of the next publish"
            ensure_free(self.root, nbytes, self.keep, what)
            path = os.path.join(self.root, f"staging-spare-{uuid.uuid4().hex[:8]}.data")
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                _reserve(fd, 0, nbytes, self.root, self.keep, what)
            except BaseException:
                _unlink(path)
                raise
            finally:
                os.close(fd)
            with self._lock:
                self._spares[nbytes] = path
            return path

    def begin_held(self, manifest: VersionManifest) -> Staging:
        """A staging copy of an older version this store never had, to be committed held (``commit(held=True)``;
        ``relay.catch_up``): nothing is evicted for it, so the room checked is that of ``hold``.
        Raises ``RelayMemoryError`` when the filesystem cannot hold it beside the copies kept and held."""
        with self._lock:
            need, have = self._hold_room(manifest.total_bytes)
        if need > have:
            raise RelayMemoryError(need, have, self.root, self.keep, f"version {manifest.version}, held")
        return Staging(self.root, manifest, reserve=True, keep=self.keep)

    def commit(self, staging: Staging, held: bool = False) -> StoredVersion:
        """Make ``staging`` readable; raises ``TornTransferError`` unless every chunk verified. ``held``: hold it in
        the same step (one ``release`` ends it), so an older version is not evicted before its holder sees it."""
        m = staging.manifest
        if staging.aborted or not staging.complete:
            missing = [i for i, ok in enumerate(staging.verified) if not ok]
            raise TornTransferError(
                f"version {m.version} cannot be committed: chunks {missing[:8]} not verified (aborted={staging.aborted})"
            )
        final = m.with_checksums(staging.checksums)
        warm = staging.detach()
        data = _data_path(self.root, m.version)
        with self._lock:
            os.replace(staging.path, data)
            if warm is not None:
                warm.path = data
                self._warm[m.version] = warm
            tmp = _json_path(self.root, m.version) + ".tmp"
            with open(tmp, "w") as f:
                f.write(final.to_json())
            os.replace(tmp, _json_path(self.root, m.version))
            stored = StoredVersion(final, data)
            self._versions[m.version] = stored
            if held:
                self._held[m.version] = self._held.get(m.version, 0) + 1
            self._evict(self.keep)
        logger.debug("relay store %s committed version %d (%d bytes)", self.root, m.version, m.total_bytes)
        return stored

    def abort(self, staging: Staging) -> None:
        """Drop a torn transfer; the readable versions are untouched."""
        staging.aborted = True
        staging.close()
        _unlink(staging.path)

    def hold(self, version: int) -> bool:
        """Keep ``version`` readable, beyond ``keep``, until ``release``; False if it is not readable now, or if the
        filesystem cannot hold ``keep`` copies, the spare and every held version at once: a held version stays while
        the next ones arrive, which a node without that room would then fail to receive (the caller gives up what it
        wanted to hold instead)."""
        v = int(version)
        with self._lock:
            stored = self._versions.get(v)
            if stored is None:
                return False
            if v in self._held:  # no second copy: one more hold to release
                self._held[v] += 1
                return True
            need, have = self._hold_room(stored.manifest.total_bytes)
            if need > have:
                logger.warning("relay store %s: no room to hold version %d beyond keep_versions=%d (%d held; needs "
                               "%d bytes, has %d)", self.root, v, self.keep, len(self._held), need, have)
                return False
            self._held[v] = 1
            return True

    def _hold_room(self, size: int) -> tuple[int, int]:
        """(bytes needed, bytes there) for ``keep`` copies, the spare and every held version plus one more of
        ``size`` (lock held)."""
        return (self.keep + len(self._held) + 1) * size + sum(self._spares), free_bytes(self.root) + self.data_bytes()

    def held(self) -> list[int]:
        with self._lock:
            return sorted(self._held)

    def release(self, version: int) -> None:
        """End one ``hold``; after the last, the version is evicted now if ``keep`` newer versions are readable."""
        with self._lock:
            v = int(version)
            left = self._held.get(v, 0) - 1
            if left > 0:
                self._held[v] = left
                return
            self._held.pop(v, None)
            self._evict(self.keep)

    def _evict(self, keep: int, recycle_size: Optional[int] = None) -> Optional[_Warm]:
        """Remove all but the ``keep`` newest committed versions that are not held (lock held).

        With ``recycle_size``, the first evicted version of that size that no reader holds is returned, locked,
        its data file left in place for ``Staging`` to take over; every other evicted version is unlinked.
        """
        recycled = None
        old = sorted(v for v in self._versions if v not in self._held)
        for v in old[: max(0, len(old) - keep)]:
            del self._versions[v]
            _unlink(_json_path(self.root, v))  # unreadable from here on
            warm = self._warm.pop(v, None)
            if (recycled is None and warm is not None and recycle_size is not None and warm.size == recycle_size
                    and warm.try_lock()):
                recycled = warm
            else:
                if warm is not None:
                    warm.close()
                _unlink(_data_path(self.root, v))
            logger.debug("relay store %s evicted version %d (keep_versions=%d%s)", self.root, v, self.keep,
                         ", pages recycled" if recycled is warm and warm is not None else "")
        return recycled

    def _recycle_as_spare(self, warm: _Warm, size: int) -> None:
        """Make a locked, evicted version's file the spare of ``size`` bytes (lock held)."""
        path = os.path.join(self.root, f"staging-spare-{uuid.uuid4().hex[:8]}.data")
        os.replace(warm.path, path)
        warm.close()  # the publisher maps the spare itself; closing the descriptor drops the exclusive lock
        self._spares[size] = path

    def _close_warm(self) -> None:
        for warm in self._warm.values():
            warm.close()
        self._warm.clear()

    def data_bytes(self) -> int:
        """Bytes of version data in the store now: readable versions, staging copies and the spare."""
        total = 0
        for name in os.listdir(self.root):
            if name.endswith(".data"):
                try:
                    total += os.stat(os.path.join(self.root, name)).st_size
                except FileNotFoundError:  # evicted or renamed meanwhile
                    continue
        return total

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

    def close(self) -> None:
        """Release the store's lock, files kept (as the relay's death would): a successor may take them over."""
        with self._lock:
            self._close_warm()
        if self._owner >= 0:
            os.close(self._owner)
            self._owner = -1

    def destroy(self) -> None:
        """Remove every file of this store (clean shutdown)."""
        with self._lock:
            if self._owner >= 0:
                bury_store(self.root)  # moved away while still locked, so no sweep or successor sees it half-removed
            self._versions.clear()
            self._spares.clear()
            self._close_warm()
        self.close()
        try:  # the shared parent (default_store_root) goes with its last relay
            os.rmdir(os.path.dirname(self.root))
        except OSError:
            pass
