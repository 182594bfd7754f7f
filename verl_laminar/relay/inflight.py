"""A version on its way into a relay's store: chunks become ready one by one.

Two producers fill an ``InFlight``: the network receiver (a chunk is ready once received and its
CRC verified) and the local publisher (the trainer wrote every byte into host memory; a verifier
thread records each chunk's CRC). The forwarder consumes chunks as they become ready, which is what
pipelines the chain: chunk i goes downstream while chunk i+1 is still arriving.
"""

from __future__ import annotations

import threading
import time
from typing import Optional

from verl_laminar.relay.manifest import VersionManifest
from verl_laminar.relay.store import Staging


class Superseded(RuntimeError):
    """The in-flight version was torn or replaced; whoever was reading it must start over."""


class InFlight:
    def __init__(self, staging: Staging, cond: threading.Condition, source: str) -> None:
        self.staging = staging
        self.manifest: VersionManifest = staging.manifest
        self.version = staging.manifest.version
        self.path = staging.path
        self.source = source  # "publish" or the upstream peer address
        self._cond = cond
        self.ready = [False] * staging.manifest.num_chunks
        self.crcs: list[Optional[int]] = [None] * staging.manifest.num_chunks
        self.failed = False
        self.done = False
        self.channel = None  # the receiving channel, closed when superseded
        self.t_begin = time.time()
        self.t_first_chunk: Optional[float] = None

    def mark_ready(self, i: int, crc: int) -> None:
        with self._cond:
            self.crcs[i] = crc
            self.ready[i] = True
            if self.t_first_chunk is None:
                self.t_first_chunk = time.time()
            self._cond.notify_all()

    def fail(self) -> None:
        with self._cond:
            self.failed = True
            if self.channel is not None:
                self.channel.close()
            self._cond.notify_all()

    def wait_chunk(self, i: int, timeout: float) -> int:
        """Block until chunk ``i`` is ready; returns its CRC. Raises ``Superseded`` if torn."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self.ready[i]:
                if self.failed:
                    raise Superseded(f"version {self.version} from {self.source} was torn before chunk {i}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Superseded(f"chunk {i} of version {self.version} did not arrive within {timeout}s")
                self._cond.wait(min(left, 0.5))
            return self.crcs[i]
