"""Chunk checksums off a relay's receive thread.

Dataflow: the receive loop reads chunk i into the staging buffer and ``submit``s it -> this thread computes its
CRC (``zlib.crc32`` releases the GIL) and marks it ready for the forwarder -> meanwhile the receive loop already
reads chunk i+1. With the check inline, every chunk's bytes waited for the previous chunk's checksum, so one
hop's throughput was bounded by the harmonic sum of the link and CRC rates; in a pipeline it is the slower one.
The first bad chunk stops the transfer: the next ``submit`` or ``finish`` raises its ``TornTransferError``.
"""

from __future__ import annotations

import queue
import threading
from typing import Optional

from verl_laminar.relay.inflight import InFlight


class ChunkVerifier:
    def __init__(self, inflight: InFlight, name: str) -> None:
        self._f = inflight
        self._q: "queue.SimpleQueue[Optional[tuple[int, int]]]" = queue.SimpleQueue()
        self.error: Optional[Exception] = None
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, index: int, crc: int) -> None:
        """Queue chunk ``index`` (received, expected ``crc``); raises an earlier chunk's checksum failure."""
        if self.error is not None:
            raise self.error
        self._q.put((index, crc))

    def finish(self) -> None:
        """Wait until every submitted chunk is checked; raises the first failure."""
        self._q.put(None)
        self._thread.join()
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        """The transfer is torn: skip what is queued and wait for the chunk being checked (its pages stay mapped
        until this returns)."""
        self._stopped = True
        self._q.put(None)
        self._thread.join()

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            if self._stopped or self.error is not None or self._f.failed:
                continue
            index, crc = item
            try:
                self._f.mark_ready(index, self._f.staging.verify(index, crc))
            except Exception as e:  # noqa: BLE001 - handed to the receive thread, which tears the transfer down
                self.error = e
