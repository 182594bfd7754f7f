"""Bytes read out of the relay's mapping, counted where they are copied.

A consumer handed zero-copy views of a version (``tensors.read_tensors``) decides how much of it moves: vLLM's
loaders narrow a full tensor to their rank's shard before they copy it into the parameter, so a rank that loads
the views itself reads about W / TP, while a consumer that first copies every tensor (verl's weight bucket, a
``.to(device)``) reads all of W. ``MappingReads`` is a torch dispatch mode that adds up, for every copy whose
source lies inside the mapping (``copy_``, ``_to_copy``, ``clone``), the bytes of that source view: what left
the mapping, measured at the copy, not computed from shapes. A copy into the meta device moves nothing and is not
counted (vLLM's layerwise reload makes one per tensor before the real one).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_aten = torch.ops.aten
# op -> index of the tensor it reads from
_READS = {_aten.copy_.default: 1, _aten._to_copy.default: 0, _aten.clone.default: 0}


class MappingReads(TorchDispatchMode):
    """``with MappingReads(view) as reads: <load>``; then ``reads.bytes`` and ``reads.copies``."""

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        n = len(view)
        self.start = torch.frombuffer(view, dtype=torch.uint8).data_ptr() if n else 0
        self.end = self.start + n
        self.bytes = 0
        self.copies = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        at = _READS.get(func)
        if at is not None and len(args) > at and not _into_meta(func, args, kwargs):
            src = args[at]
            if isinstance(src, torch.Tensor) and src.device.type == "cpu" and src.numel():
                ptr = src.data_ptr()
                if self.start <= ptr < self.end:
                    self.bytes += src.numel() * src.element_size()
                    self.copies += 1
        return func(*args, **(kwargs or {}))


def _into_meta(func: Any, args: tuple, kwargs: Any) -> bool:
    """A copy whose destination is on the meta device moves no bytes: vLLM's layerwise reload first runs each
    weight loader against meta parameters (to learn what a layer loads) and only then into real memory."""
    if func is _aten.copy_.default:
        dst = args[0]
        return isinstance(dst, torch.Tensor) and dst.device.type == "meta"
    device = (kwargs or {}).get("device")
    return device is not None and torch.device(device).type == "meta"
