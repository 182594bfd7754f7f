"""Publishing a version into the master relay's host memory (the trainer side of the relay service).

Dataflow: ``prepare`` (once, and again in the background after every publish): the master
pre-allocates a tmpfs file and the publisher maps it -> ``publish``: the publisher copies the bytes
into that mapping (one host-memory copy, no page faults) -> ``publish_prepared`` (one control call:
the master takes the file as the version's staging, checksums chunks and streams them down the
chain in the background). The stall is that copy plus one short call, whatever the number of
relays. Without a warm mapping: ``begin_publish`` -> ``pwrite`` -> ``end_publish``.

Relays are reached through a handle with ``call(method, *args)``: ``LocalHandle`` (same process),
``RelayProcess`` (standalone process) or ``RayHandle`` (Ray actor).
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
import time
from typing import Any, Iterable, Optional, Protocol

from verl_laminar.relay.manifest import TensorEntry, VersionManifest

logger = logging.getLogger(__name__)


class RelayGoneError(ConnectionError):
    """The relay behind a handle is dead (its process exited or was killed); a new master must take over.

    A ``ConnectionError`` (so an ``OSError``) like the socket errors of a standalone relay: callers handle
    both the same way.
    """


class RelayHandle(Protocol):
    def call(self, method: str, *args: Any, **kwargs: Any) -> Any: ...


class LocalHandle:
    def __init__(self, relay: Any) -> None:
        self.relay = relay

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.relay, method)(*args, **kwargs)


class RayHandle:
    def __init__(self, actor: Any, timeout_s: Optional[float] = 60.0) -> None:
        self.actor = actor
        self.timeout_s = timeout_s

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        import ray
        from ray.exceptions import RayActorError

        try:
            return ray.get(getattr(self.actor, method).remote(*args, **kwargs), timeout=self.timeout_s)
        except RayActorError as e:  # died before or during the call; not a bug in the call itself
            raise RelayGoneError(f"relay actor died during {method}: {e}") from e


class Publisher:
    """Trainer-side writer into a master relay on the same machine."""

    def __init__(self, handle: RelayHandle) -> None:
        self.handle = handle
        self._warm: Optional[tuple[int, str, mmap.mmap]] = None  # (nbytes, spare path, mapping)
        self._lock = threading.Lock()
        self._bg: Optional[threading.Thread] = None

    def prepare(self, nbytes: int) -> None:
        """Map the master's spare buffer for ``nbytes`` now, so the next publish only copies."""
        path = self.handle.call("prepare_publish", nbytes)
        if not path:
            return
        fd = os.open(path, os.O_RDWR)
        try:
            m = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
        finally:
            os.close(fd)
        with self._lock:
            old, self._warm = self._warm, (nbytes, path, m)
        if old is not None:
            old[2].close()

    def publish_parts(self, version: int, total_bytes: int, parts: Iterable[tuple[int, Any]],
                      tensors: tuple[TensorEntry, ...] = (), tp_size: int = 1, reprepare: bool = True) -> float:
        """Write ``(offset, bytes-like)`` parts of a ``total_bytes`` version; returns the stall (s)."""
        if self._bg is not None:
            self._bg.join()
        t0 = time.perf_counter()
        manifest = VersionManifest(version=version, total_bytes=total_bytes, chunk_size=max(1, total_bytes),
                                   tensors=tensors, tp_size=tp_size).to_json()
        with self._lock:
            warm, self._warm = self._warm, None
        if warm is not None and warm[0] >= total_bytes:
            for offset, data in parts:
                view = memoryview(data).cast("B")
                warm[2][offset : offset + len(view)] = view
            self.handle.call("publish_prepared", manifest, warm[1])
        else:
            path = self.handle.call("begin_publish", manifest)
            _pwrite_parts(path, parts)
            self.handle.call("end_publish", version)
        stall = time.perf_counter() - t0
        # unmapping the used buffer and mapping the next cost tens of ms per GB: off the trainer's path
        self._bg = threading.Thread(target=self._after_publish, args=(warm, total_bytes if reprepare else 0),
                                    daemon=True)
        self._bg.start()
        return stall

    def warm_buffer(self) -> Optional[mmap.mmap]:
        """The pre-mapped buffer of the next publish (write the version into it, then ``publish_written``)."""
        if self._bg is not None:
            self._bg.join()
        with self._lock:
            return self._warm[2] if self._warm is not None else None

    def publish_written(self, version: int, total_bytes: int, tensors: tuple[TensorEntry, ...] = (),
                        tp_size: int = 1, reprepare: bool = True) -> float:
        """The first ``total_bytes`` of ``warm_buffer()`` hold the version: hand it to the master."""
        return self.publish_parts(version, total_bytes, [], tensors, tp_size, reprepare)

    def _after_publish(self, used: Optional[tuple[int, str, mmap.mmap]], nbytes: int) -> None:
        if used is not None:
            try:
                used[2].close()
            except BufferError:  # a caller still holds a view of it; it is unmapped when that goes
                logger.debug("publish buffer %s still referenced; leaving the unmap to its owner", used[1])
        if nbytes:
            try:
                self.prepare(nbytes)
            except OSError as e:  # RelayGoneError included
                # The master relay went away (shutdown after the last publish, or a failover in progress): the next
                # publish finds no warm buffer and takes the begin/end path, which raises if the relay is still gone.
                logger.info("could not pre-map the next publish buffer (%s); the next publish will not be warm", e)

    def publish_bytes(self, version: int, data: Any) -> float:
        return self.publish_parts(version, memoryview(data).nbytes, [(0, data)])

    def close(self) -> None:
        if self._bg is not None:
            self._bg.join()
        with self._lock:
            w, self._warm = self._warm, None
        if w is not None:
            w[2].close()


def _pwrite_parts(path: str, parts: Iterable[tuple[int, Any]]) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        for offset, data in parts:
            view = memoryview(data).cast("B")
            written = 0
            while written < len(view):
                written += os.pwrite(fd, view[written:], offset + written)
    finally:
        os.close(fd)


def publish_bytes(handle: RelayHandle, version: int, data: Any) -> float:
    """Publish one opaque buffer as ``version`` without a warm mapping; returns the stall in seconds."""
    return Publisher(handle).publish_parts(version, memoryview(data).nbytes, [(0, data)], reprepare=False)
