"""What one tensor-parallel rank of a vLLM replica keeps of a full-tensor version, read in place.

The relay stores full tensors (``tp_size`` 1), and vLLM's loaders narrow each one by rank after it was handed
over; handing over the whole version to every rank (verl's weight bucket) moves TP times the bytes a rank keeps.
``rank_slice`` says, from a manifest entry alone, which slice of it rank ``r`` of ``tp`` keeps, by vLLM's rules for
Llama/Qwen2-style decoders (``reshard.shard_rule``): column-parallel tensors (q/k/v, gate/up, embedding, LM head)
split along dim 0, row-parallel ones (o/down) along dim 1, everything else replicated; key/value projections with
fewer heads than ranks replicated per head group; the vocabulary padded to ``VOCAB_PAD`` rows before it is split,
so the last rank may keep fewer rows (or none). ``read_rank`` yields those slices as zero-copy views of the
mapping, so a consumer that copies them to its device copies about W / TP plus the replicated part.

Pure but for the views; which consumer copies them into vLLM's parameters is the caller's business.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Iterator, Optional

import torch

from verl_laminar.relay.manifest import TensorEntry, VersionManifest
from verl_laminar.relay.reshard import ReshardError, shard_rule
from verl_laminar.relay.tensors import read_tensors

VOCAB_PAD = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE: the vocabulary is padded to a multiple of it, then split
_VOCAB = re.compile(r"(embed_tokens|lm_head)\.weight$")


@dataclass(frozen=True)
class RankSlice:
    """Rows (``dim`` 0) or columns (``dim`` 1) ``[start, start + length)`` of tensor ``name``; ``dim`` None: all."""

    name: str
    dim: Optional[int]
    start: int
    length: int
    nbytes: int  # bytes of the slice (what the rank copies)


def _pad(n: int, to: int) -> int:
    return -(-n // to) * to


def rank_slice(entry: TensorEntry, rank: int, tp: int, num_kv_heads: Optional[int] = None,
               vocab_pad: int = VOCAB_PAD) -> RankSlice:
    """The slice of ``entry`` (a full tensor) that rank ``rank`` of a ``tp``-way vLLM replica keeps."""
    if tp < 1 or not 0 <= rank < tp:
        raise ReshardError(f"rank {rank} is not a rank of tensor-parallel size {tp}")
    if entry.rank is not None:
        raise ReshardError(f"{entry.name} is already a shard (of rank {entry.rank}); rank slices are cut from a "
                           "version of full tensors (tp_size 1)")
    rule = shard_rule(entry.name)
    if tp == 1 or rule.dim is None or len(entry.shape) <= rule.dim:
        return RankSlice(entry.name, None, 0, entry.shape[0] if entry.shape else 1, entry.nbytes)
    size = entry.shape[rule.dim]
    row_bytes = entry.nbytes // size if size else 0
    if _VOCAB.search(entry.name):
        per = _pad(size, vocab_pad) // tp
        if _pad(size, vocab_pad) % tp:
            raise ReshardError(f"{entry.name}: the padded vocabulary ({_pad(size, vocab_pad)} rows) does not split "
                               f"over tp={tp}")
        start = min(rank * per, size)
        length = max(0, min(per, size - start))
    elif rule.kv and num_kv_heads is not None and num_kv_heads < tp:
        if tp % num_kv_heads:
            raise ReshardError(f"{entry.name}: {num_kv_heads} kv heads cannot be replicated evenly over tp={tp}")
        per = size // num_kv_heads
        start, length = (rank * num_kv_heads // tp) * per, per
    else:
        if size % tp:
            raise ReshardError(f"{entry.name}: dimension {rule.dim} of size {size} does not split over tp={tp}")
        length = size // tp
        start = rank * length
    return RankSlice(entry.name, rule.dim, start, length, length * row_bytes)


def rank_slices(manifest: VersionManifest, rank: int, tp: int, num_kv_heads: Optional[int] = None
                ) -> list[RankSlice]:
    return [rank_slice(e, rank, tp, num_kv_heads) for e in manifest.tensors]


def rank_bytes(manifest: VersionManifest, rank: int, tp: int, num_kv_heads: Optional[int] = None) -> int:
    """Bytes rank ``rank`` copies when it reads only its slices (the whole version: ``manifest.total_bytes``)."""
    return sum(s.nbytes for s in rank_slices(manifest, rank, tp, num_kv_heads))


def narrow(t: torch.Tensor, s: RankSlice) -> torch.Tensor:
    """``t`` (the full tensor) cut to ``s``: a view, no copy (a column slice is not contiguous)."""
    return t if s.dim is None else t.narrow(s.dim, s.start, s.length)


def read_rank(manifest: VersionManifest, view: memoryview, rank: int, tp: int,
              num_kv_heads: Optional[int] = None) -> Iterator[tuple[str, torch.Tensor, RankSlice]]:
    """``(name, slice view, RankSlice)`` of every tensor, in the version's order, as rank ``rank`` keeps it."""
    slices = {s.name: s for s in rank_slices(manifest, rank, tp, num_kv_heads)}
    for name, t in read_tensors(manifest, view):
        s = slices[name]
        yield name, narrow(t, s), s


def entries_of(named: Iterable[tuple[str, torch.Tensor]]) -> list[TensorEntry]:
    """Manifest entries of in-memory full tensors (offsets unused), for sizing a split without a relay."""
    return [TensorEntry(name=n, dtype=str(t.dtype).removeprefix("torch."), shape=tuple(t.shape), offset=0,
                        nbytes=t.numel() * t.element_size()) for n, t in named]

