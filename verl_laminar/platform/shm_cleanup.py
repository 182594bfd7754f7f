"""Shared-memory hygiene: POSIX segments vLLM's CPU engine leaves behind, and the stores of relays that are gone.

vLLM segments: only old segments that no live process maps are removed. The age floor matters: a multiprocessing
semaphore exists, unmapped, between its creation by a parent and its opening by a spawned child; deleting it then
kills the child's start-up (vLLM's engine died that way when a cleanup ran beside a starting job).

Relay stores (``/dev/shm/laminar-relay/<relay_id>``): a relay holds an ``flock`` on ``<store>/.lock`` for its
lifetime (``acquire_store``) and the kernel drops it when the process dies, SIGKILL and machine-local crashes
included. ``sweep_relay_stores`` removes exactly the stores whose lock it can take, so a live relay's versions are
never touched, whichever job or namespace it belongs to. A swept store is renamed away while still locked, so a relay
that was waiting for that lock sees the path gone and starts a fresh store.

    python -m verl_laminar.platform.shm_cleanup
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Optional

logger = logging.getLogger(__name__)

SHM = Path("/dev/shm")
PREFIXES = ("psm_", "sem.mp-")
MIN_AGE_S = 30 * 60
RELAY_DIR = "laminar-relay"
LOCK_FILE = ".lock"
TOMBSTONE_PREFIX = ".swept-"  # a store directory being removed; no relay opens these


class StoreInUseError(RuntimeError):
    """Another live relay holds this store directory."""


def _mapped_shm_names() -> set[str]:
    names: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            for line in maps.read_text().splitlines():
                if "/dev/shm/" in line:
                    names.add(line.rsplit("/dev/shm/", 1)[1].split(" ")[0])
        except OSError:  # process exited or is not ours to read
            continue
    return names


def cleanup(min_age_s: float = MIN_AGE_S) -> list[str]:
    if not SHM.is_dir():
        return []
    in_use = _mapped_shm_names()
    now = time.time()
    removed = []
    for path in SHM.iterdir():
        if not path.name.startswith(PREFIXES) or path.name in in_use:
            continue
        st = path.stat()
        if st.st_uid == os.getuid() and now - st.st_mtime > min_age_s:
            try:
                os.unlink(path)
                removed.append(path.name)
            except OSError as e:
                logger.warning("could not remove %s: %s", path, e)
    logger.info("removed %d stale shared-memory segments", len(removed))
    return removed


# ---- relay stores ----
def relay_store_base() -> str:
    """Where relay stores live: ``/dev/shm/laminar-relay`` when tmpfs shared memory exists, else the temp dir."""
    base = str(SHM) if SHM.is_dir() else tempfile.gettempdir()
    return os.path.join(base, RELAY_DIR)


def _lock_holder(root: str) -> str:
    try:
        with open(os.path.join(root, LOCK_FILE)) as f:
            return f.read().strip() or "unknown"
    except OSError:
        return "unknown"


def acquire_store(root: str, timeout_s: float = 10.0) -> int:
    """Create the store directory ``root`` and lock it; returns the descriptor, to keep open while the store lives.

    Raises ``StoreInUseError`` when another live process still holds it after ``timeout_s``.
    """
    lock = os.path.join(root, LOCK_FILE)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            os.makedirs(root, exist_ok=True)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        except FileNotFoundError:  # a sweep removed the (empty) parent between the two steps: start again
            if time.monotonic() > deadline:
                raise
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            if time.monotonic() > deadline:
                raise StoreInUseError(
                    f"relay store {root} is held by a live relay (pid {_lock_holder(root)}); give this relay its own "
                    f"relay_id (its store is {relay_store_base()}/<relay_id>) or root, or stop the other one") from None
            time.sleep(0.05)  # a sweep holds it for a moment, or the previous owner is still exiting
            continue
        try:  # a sweep may have moved the directory away while we waited: the lock must be the one at ``lock``
            st, here = os.fstat(fd), os.stat(lock)
            if (st.st_dev, st.st_ino) == (here.st_dev, here.st_ino):
                os.ftruncate(fd, 0)
                os.pwrite(fd, str(os.getpid()).encode(), 0)  # names the holder in the error above
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def bury_store(root: str) -> None:
    """Rename the store ``root`` out of the way, then delete it (the caller holds its lock)."""
    tomb = os.path.join(os.path.dirname(root), f"{TOMBSTONE_PREFIX}{os.path.basename(root)}-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(root, tomb)
    except FileNotFoundError:  # already gone
        return
    shutil.rmtree(tomb, ignore_errors=True)


def remove_unused_store(root: str) -> bool:
    """Remove the store directory ``root`` unless a live relay holds it; True when removed."""
    try:
        fd = os.open(os.path.join(root, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o600)
    except (FileNotFoundError, NotADirectoryError):
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        bury_store(root)
        return True
    finally:
        os.close(fd)


def sweep_relay_stores(base: Optional[str] = None) -> list[str]:
    """Remove the relay stores under ``base`` (default ``relay_store_base()``) whose relays are gone; returns them."""
    base = base or relay_store_base()
    try:
        names = sorted(os.listdir(base))
    except FileNotFoundError:
        return []
    removed = []
    for name in names:
        path = os.path.join(base, name)
        if name.startswith(TOMBSTONE_PREFIX):  # a sweep or shutdown interrupted half-way
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.isdir(path) and remove_unused_store(path):
            removed.append(path)
    try:  # the shared parent goes with its last store
        os.rmdir(base)
    except OSError:
        pass
    if removed:
        logger.info("removed %d relay stores of relays that are gone: %s", len(removed), removed)
    return removed


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cleanup()
    sweep_relay_stores()
