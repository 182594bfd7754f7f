"""Hands out host uids to concurrent snippets, one uid per running snippet, across processes.

Why: the kernel ignores RLIMIT_NPROC for uid 0 and counts it per uid, so when the caller is root every
snippet runs as a plain uid, and two snippets never share one (a fork bomb in one would otherwise eat the
other's process budget). verl runs many agent-loop workers per machine, so the allocation must hold across
processes: each uid is claimed with an exclusive, non-blocking flock on its own lock file, which the kernel
releases if the holder dies.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import tempfile
import time
from typing import Iterator

_LOCK_DIR_NAME = "verl_laminar_sandbox_uids"


class UidPoolExhausted(RuntimeError):
    pass


class UidPool:
    def __init__(self, base: int, count: int, lock_dir: str | None = None) -> None:
        self.base = base
        self.count = count
        self.lock_dir = lock_dir or os.path.join(tempfile.gettempdir(), _LOCK_DIR_NAME)
        os.makedirs(self.lock_dir, mode=0o700, exist_ok=True)

    def _try(self, uid: int) -> int | None:
        fd = os.open(os.path.join(self.lock_dir, f"{uid}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    @contextlib.contextmanager
    def claim(self, wait_s: float = 30.0) -> Iterator[int]:
        deadline = time.monotonic() + wait_s
        # A random start spreads processes over the range, so they rarely probe the same lock files.
        offset = random.randrange(self.count)
        while True:
            for i in range(self.count):
                uid = self.base + (offset + i) % self.count
                fd = self._try(uid)
                if fd is not None:
                    try:
                        yield uid
                    finally:
                        fcntl.flock(fd, fcntl.LOCK_UN)
                        os.close(fd)
                    return
            if time.monotonic() > deadline:
                raise UidPoolExhausted(
                    f"all {self.count} sandbox uids from {self.base} are busy: raise sandbox.uid_count"
                )
            time.sleep(0.05)
