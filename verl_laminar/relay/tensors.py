"""Named tensors <-> one version buffer (torch side of the relay service).

Publisher side: ``publish_tensors`` lays the trainer's ``(name, tensor)`` stream out at aligned
offsets and copies every tensor straight into the master relay's pre-mapped host memory (from GPU
that is one device-to-host copy; nothing goes through an intermediate CPU tensor). Floating-point
tensors are first cast to the rollout's dtype on their own device (verl's FSDP actor hands over its
fp32 master weights; a bf16 rollout needs half the bytes), so the device-to-host copy moves only
what the rollout loads. When the publisher's buffer is pinned those copies are asynchronous and the
writer synchronizes once before handing the version over. Reader side: ``read_tensors`` turns a
mapped version back into zero-copy tensors (``torch.frombuffer``).
"""

from __future__ import annotations

import time
import warnings
from typing import Iterable, Iterator, Optional, Union

import torch

from verl_laminar.relay.manifest import TensorEntry, VersionManifest, align_up
from verl_laminar.relay.publish import Publisher


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def to_dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown tensor dtype {name!r} in a relay manifest; expected a torch dtype name")
    return dt


# spellings accepted for the version dtype: torch names plus the short forms verl's configs use
_DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}


def resolve_dtype(dtype: Union[None, str, torch.dtype]) -> Optional[torch.dtype]:
    """The floating-point dtype versions are stored in (None: keep every tensor's own dtype)."""
    if dtype is None:
        return None
    if isinstance(dtype, torch.dtype):
        dt = dtype
    else:
        name = str(dtype).removeprefix("torch.").lower()
        dt = getattr(torch, _DTYPE_ALIASES.get(name, name), None)
    if not isinstance(dt, torch.dtype) or not dt.is_floating_point:
        raise ValueError(f"relay version dtype {dtype!r} is not a floating-point torch dtype; use e.g. "
                         "'bfloat16' (the rollout's actor_rollout_ref.rollout.dtype) or leave it unset")
    return dt


def stored_dtype(src: torch.dtype, target: Optional[torch.dtype]) -> torch.dtype:
    """The dtype a tensor of dtype ``src`` is stored in: floats take ``target``, integers and bools stay."""
    return target if target is not None and src.is_floating_point else src


def cast_for_version(t: torch.Tensor, target: Optional[torch.dtype]) -> torch.Tensor:
    """``t`` in its stored dtype, cast on its own device (so a GPU tensor crosses to the host already narrow)."""
    dt = stored_dtype(t.dtype, target)
    return t.detach() if dt == t.dtype else t.detach().to(dt)


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _entry(name: str, t: torch.Tensor, offset: int, rank: Optional[int] = None) -> TensorEntry:
    return TensorEntry(name=name, dtype=dtype_name(t.dtype), shape=tuple(t.shape), offset=offset,
                       nbytes=t.numel() * t.element_size(), rank=rank)


def layout(named: Iterable[tuple[str, torch.Tensor]], ranks: Optional[Iterable[Optional[int]]] = None
           ) -> tuple[list[TensorEntry], int]:
    """Aligned offsets for ``named`` tensors, in order; returns (entries, total bytes)."""
    entries, off = [], 0
    ranks = iter(ranks) if ranks is not None else None
    for name, t in named:
        e = _entry(name, t, off, next(ranks) if ranks is not None else None)
        entries.append(e)
        off = align_up(off + e.nbytes)
    return entries, off


def copy_is_async(src: torch.Tensor, target_pinned: bool) -> bool:
    """Whether a copy of ``src`` into the warm buffer may be non-blocking.

    Only a device tensor into page-locked memory: a non-blocking copy into pageable memory is staged
    synchronously by CUDA anyway, and a CPU source has nothing to overlap with.
    """
    return target_pinned and src.device.type == "cuda"


def _synchronize(devices: set[torch.device]) -> None:
    for d in devices:
        torch.cuda.synchronize(d)


class VersionWriter:
    """Accumulates one version tensor by tensor, straight into the publisher's warm buffer if any.

    ``dtype``: floating-point tensors are stored in it (None: as they come).
    """

    def __init__(self, publisher: Publisher, dtype: Union[None, str, torch.dtype] = None) -> None:
        self.publisher = publisher
        self.dtype = resolve_dtype(dtype)
        self.t0 = time.perf_counter()
        self._warm = publisher.warm_buffer()
        self._pinned = self._warm is not None and publisher.warm_is_pinned()
        self._target = torch.frombuffer(self._warm, dtype=torch.uint8) if self._warm is not None else None
        self.entries: list[TensorEntry] = []
        self._parts: list[tuple[int, torch.Tensor]] = []  # host copies of what did not fit the warm buffer
        self._first_spill: Optional[int] = None
        self._pending: set[torch.device] = set()  # devices with copies into the buffer still in flight
        self._off = 0

    def add(self, name: str, t: torch.Tensor, rank: Optional[int] = None) -> None:
        t = cast_for_version(t, self.dtype)
        e = _entry(name, t, self._off, rank)
        fits = self._target is not None and self._first_spill is None and e.offset + e.nbytes <= len(self._target)
        if fits:
            non_blocking = copy_is_async(t, self._pinned)
            # the source may be freed right after: the caching allocator only reuses its memory for work
            # queued behind this copy on the same stream, so the bytes stay valid until the copy ran
            self._target[e.offset : e.offset + e.nbytes].copy_(_bytes_of(t), non_blocking=non_blocking)
            if non_blocking:
                self._pending.add(t.device)
        else:
            if self._first_spill is None:
                self._first_spill = e.offset
            self._parts.append((e.offset, _bytes_of(t).cpu()))
        self.entries.append(e)
        self._off = align_up(self._off + e.nbytes)

    @property
    def cold(self) -> bool:
        """Whether any tensor went through a private host copy (no warm buffer, or one too small)."""
        return (self._warm is None and self._off > 0) or self._first_spill is not None

    @property
    def nbytes(self) -> int:
        """Size of the version so far (the next publish's warm buffer needs at least this)."""
        return self._off

    def publish(self, version: int, tp_size: int = 1, publisher: Optional[Publisher] = None) -> float:
        """Hand the version to the master relay; returns the stall since this writer was created (s).

        ``publisher``: another master's, when the first died during this publish. The tensors were consumed
        already, so the bytes gathered here (the dead master's buffer stays mapped) are copied over.
        """
        _synchronize(self._pending)  # the one wait for every asynchronous device-to-host copy
        self._pending.clear()
        self._target = None  # release our export of the mapping before the publisher unmaps it
        if publisher is None and self._first_spill is None and self._warm is not None:
            self.publisher.publish_written(version, self._off, tuple(self.entries), tp_size)
        else:
            end = self._off if self._first_spill is None else self._first_spill
            head = bytes(memoryview(self._warm)[:end]) if self._warm is not None else b""
            parts = ([(0, head)] if head else []) + [(off, b.numpy()) for off, b in self._parts]
            (publisher or self.publisher).publish_parts(version, self._off, parts, tuple(self.entries), tp_size)
        return time.perf_counter() - self.t0


def publish_tensors(
    publisher: Publisher,
    version: int,
    named: Iterable[tuple[str, torch.Tensor]],
    tp_size: int = 1,
    ranks: Optional[list[Optional[int]]] = None,
    dtype: Union[None, str, torch.dtype] = None,
) -> float:
    """Publish ``named`` tensors as ``version`` (floats stored as ``dtype``); returns the publisher's stall (s).

    With a warm buffer of the right size the tensors are copied in as they arrive; otherwise they
    are gathered on the host first (a first publish nobody warmed; later ones reuse the size).
    """
    w = VersionWriter(publisher, dtype)
    for i, (name, t) in enumerate(named):
        w.add(name, t, ranks[i] if ranks else None)
    return w.publish(version, tp_size)


def read_tensors(manifest: VersionManifest, view: memoryview, rank: Optional[int] = None
                 ) -> Iterator[tuple[str, torch.Tensor]]:
    """Zero-copy ``(name, tensor)`` pairs of a mapped version (only ``rank``'s when given)."""
    entries = manifest.tensors if rank is None else manifest.for_rank(rank)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only mapping: we never write through it
        base = torch.frombuffer(view, dtype=torch.uint8) if len(view) else torch.empty(0, dtype=torch.uint8)
    for e in entries:
        t = base[e.offset : e.offset + e.nbytes].view(to_dtype(e.dtype)).reshape(e.shape)
        yield e.name, t
