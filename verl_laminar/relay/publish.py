"""Publishing a version into the master relay's host memory (the trainer side of the relay service).

Dataflow: ``prepare`` (once, and again in the background after every publish): the master
pre-allocates a tmpfs file and the publisher maps it -> ``publish``: the publisher copies the bytes
into that mapping (one host-memory copy, no page faults) -> ``publish_prepared`` (one control call:
the master takes the file as the version's staging, checksums chunks and streams them down the
chain in the background). The stall is that copy plus one short call, whatever the number of
relays. Without a warm mapping: ``begin_publish`` -> ``pwrite`` -> ``end_publish``. The first publish is
warm only if someone calls ``prepare`` (or ``ensure_warm``) with its size beforehand; later ones reuse the
last size.

With CUDA, the mapping is registered as page-locked memory (``cudaHostRegister``), so device-to-host
copies into it run at full DMA speed and asynchronously; it is unregistered before it is unmapped.

Relays are reached through a handle with ``call(method, *args)``: ``LocalHandle`` (same process),
``RelayProcess`` (standalone process) or ``RayHandle`` (Ray actor).
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Protocol

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


# ---- page-locking (CUDA only; every function is a no-op without a CUDA device) ----
CUDA_HOST_REGISTER_PORTABLE = 1  # pinned for every CUDA context: prepare may run on a background thread


def _cudart() -> Any:
    """CUDA's runtime bindings when this process can use a CUDA device, else None."""
    import torch

    return torch.cuda.cudart() if torch.cuda.is_available() else None


def _current_cuda_device() -> Optional[int]:
    import torch

    return torch.cuda.current_device() if torch.cuda.is_available() else None


def _bind_thread_to(device: Optional[int]) -> None:
    """Make ``device`` current in this thread: a new thread starts on device 0, and pinning from it would
    otherwise create a CUDA context there (hundreds of MB on another rank's GPU when several are visible)."""
    if device is not None:
        import torch

        torch.cuda.set_device(device)


def mapping_address(m: mmap.mmap) -> int:
    """The address of ``m``'s first byte (the ctypes view is dropped at once so ``m`` can still close)."""
    view = ctypes.c_char.from_buffer(m)
    try:
        return ctypes.addressof(view)
    finally:
        del view


def pin_mapping(m: mmap.mmap, nbytes: int, cudart: Callable[[], Any] = _cudart) -> Optional[int]:
    """Register ``m`` as page-locked host memory; returns the registered address, None if not pinned.

    A failed registration (e.g. the driver refuses a file-backed mapping) only costs speed: copies into
    the mapping then stay synchronous, so it is logged, not raised. Whether the driver accepts this
    shared tmpfs mapping, and how long pinning ~150 GB takes, only a GPU host can tell; it runs in
    ``prepare``, i.e. off the trainer's path except before the first publish.
    """
    rt = cudart()
    if rt is None or nbytes <= 0:
        return None
    addr = mapping_address(m)
    err = int(rt.cudaHostRegister(addr, nbytes, CUDA_HOST_REGISTER_PORTABLE))
    if err != 0:
        logger.warning("cudaHostRegister of the %d-byte publish buffer failed (cudaError %d); device-to-host "
                       "copies into it stay synchronous", nbytes, err)
        return None
    return addr


def unpin_mapping(addr: Optional[int], cudart: Callable[[], Any] = _cudart) -> None:
    """Undo ``pin_mapping`` (must run before the mapping is closed: CUDA would keep a dangling registration)."""
    if addr is None:
        return
    rt = cudart()
    err = int(rt.cudaHostUnregister(addr)) if rt is not None else 0
    if err != 0:
        logger.warning("cudaHostUnregister of the publish buffer at %#x failed (cudaError %d)", addr, err)


@dataclass
class WarmBuffer:
    """A mapped spare buffer of the master relay, page-locked when ``pinned_at`` is set."""

    nbytes: int
    path: str
    mapping: mmap.mmap
    pinned_at: Optional[int] = None

    def release(self, cudart: Callable[[], Any] = _cudart) -> None:
        """Unpin, then unmap (a caller still holding a view defers the unmap to that view's release)."""
        unpin_mapping(self.pinned_at, cudart)
        self.pinned_at = None
        try:
            self.mapping.close()
        except BufferError:
            logger.debug("publish buffer %s still referenced; leaving the unmap to its owner", self.path)


class Publisher:
    """Trainer-side writer into a master relay on the same machine.

    ``cudart``: how to reach CUDA's runtime for page-locking (tests pass a fake; default: real, when present).
    """

    def __init__(self, handle: RelayHandle, cudart: Callable[[], Any] = _cudart) -> None:
        self.handle = handle
        self._cudart = cudart
        self._device = _current_cuda_device()  # the trainer rank's GPU, for the background re-preparation
        self._warm: Optional[WarmBuffer] = None
        self._lock = threading.Lock()
        self._bg: Optional[threading.Thread] = None

    def prepare(self, nbytes: int) -> None:
        """Map (and on CUDA pin) the master's spare buffer for ``nbytes`` now, so the next publish only copies."""
        path = self.handle.call("prepare_publish", nbytes)
        if not path:
            return
        fd = os.open(path, os.O_RDWR)
        try:
            m = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
        finally:
            os.close(fd)
        buf = WarmBuffer(nbytes, path, m, pin_mapping(m, nbytes, self._cudart))
        with self._lock:
            old, self._warm = self._warm, buf
        if old is not None:
            old.release(self._cudart)

    def ensure_warm(self, nbytes: int) -> bool:
        """Make sure the next publish of up to ``nbytes`` is warm; returns whether a new buffer was mapped.

        Waits for a re-preparation still running after the last publish, then maps only if the buffer is
        missing or smaller (a larger buffer serves a smaller version: the relay trims the file).
        """
        if nbytes <= 0:
            return False
        if self._bg is not None:
            self._bg.join()
        with self._lock:
            if self._warm is not None and self._warm.nbytes >= nbytes:
                return False
        self.prepare(nbytes)
        return True

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
        if warm is not None and warm.nbytes >= total_bytes:
            for offset, data in parts:
                view = memoryview(data).cast("B")
                warm.mapping[offset : offset + len(view)] = view
            try:
                self.handle.call("publish_prepared", manifest, warm.path)
            except OSError:  # the master died or hung (RelayGoneError, timeouts)
                # the caller may still copy these bytes to a new master: keep the mapping, drop the pinning
                unpin_mapping(warm.pinned_at, self._cudart)
                warm.pinned_at = None
                raise
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
            return self._warm.mapping if self._warm is not None else None

    def warm_is_pinned(self) -> bool:
        """Whether the buffer ``warm_buffer`` returns is page-locked (device copies into it may be async)."""
        with self._lock:
            return self._warm is not None and self._warm.pinned_at is not None

    def publish_written(self, version: int, total_bytes: int, tensors: tuple[TensorEntry, ...] = (),
                        tp_size: int = 1, reprepare: bool = True) -> float:
        """The first ``total_bytes`` of ``warm_buffer()`` hold the version: hand it to the master."""
        return self.publish_parts(version, total_bytes, [], tensors, tp_size, reprepare)

    def _after_publish(self, used: Optional[WarmBuffer], nbytes: int) -> None:
        _bind_thread_to(self._device)
        if used is not None:
            used.release(self._cudart)
        if nbytes:
            try:
                self.prepare(nbytes)
            except OSError as e:  # RelayGoneError included
                # The master relay went away (shutdown after the last publish, or a failover in progress): the next
                # publish finds no warm buffer and takes the begin/end path, which raises if the relay is still gone.
                logger.info("could not pre-map the next publish buffer (%s); the next publish will not be warm", e)
            except MemoryError as e:  # RelayMemoryError: /dev/shm is short; the next publish raises it with the fix
                logger.warning("could not reserve the next publish buffer: %s", e)

    def publish_bytes(self, version: int, data: Any) -> float:
        return self.publish_parts(version, memoryview(data).nbytes, [(0, data)])

    def close(self) -> None:
        if self._bg is not None:
            self._bg.join()
        with self._lock:
            w, self._warm = self._warm, None
        if w is not None:
            w.release(self._cudart)


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
