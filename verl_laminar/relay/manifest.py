"""Version manifests: what one published weight version contains and how it is chunked (pure, no torch).

A version is one flat byte buffer. The manifest names the tensors inside it (name, dtype, shape,
byte offset), optionally the tensor-parallel layout the master resharded it into, and how the
buffer is cut into chunks for the chain broadcast. Per-chunk CRC32 checksums travel with the chunks
and are recorded once a chunk is verified; a version is readable only when every chunk is.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import asdict, dataclass, field, replace
from typing import Optional

ALIGN = 64  # byte alignment of every tensor inside a version buffer


class ManifestError(ValueError):
    """A manifest is inconsistent (the message names the field and the expected value)."""


def align_up(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


def crc32(buf) -> int:
    """CRC32 of a bytes-like object (zlib releases the GIL on large buffers)."""
    return zlib.crc32(buf) & 0xFFFFFFFF


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str  # torch dtype name without the "torch." prefix, e.g. "bfloat16"
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    rank: Optional[int] = None  # tensor-parallel rank this shard belongs to; None = every rank loads it


@dataclass(frozen=True)
class DeltaRef:
    """What a delta transfer rebuilds: ``target`` (the whole version's manifest, its per-chunk CRCs being the digest
    the rebuilt bytes must match) from the receiver's own ``base`` version and the transfer's bytes (relay/delta.py)."""

    base: int
    target: "VersionManifest"


@dataclass(frozen=True)
class VersionManifest:
    version: int
    total_bytes: int
    chunk_size: int
    tensors: tuple[TensorEntry, ...] = ()
    tp_size: int = 1
    checksums: tuple[int, ...] = field(default=())  # one CRC32 per chunk once known, else empty
    # set on a delta transfer: the bytes (total_bytes, chunks, checksums) are the delta, never a readable version
    delta: Optional[DeltaRef] = None

    def __post_init__(self) -> None:
        if int(self.version) != self.version or self.version < 0:
            raise ManifestError(f"version={self.version!r} must be an integer >= 0 (the trainer's global step)")
        if self.total_bytes < 0:
            raise ManifestError(f"total_bytes={self.total_bytes!r} must be >= 0")
        if self.chunk_size < 1:
            raise ManifestError(f"chunk_size={self.chunk_size!r} must be >= 1 byte")
        if self.checksums and len(self.checksums) != self.num_chunks:
            raise ManifestError(
                f"{len(self.checksums)} checksums for {self.num_chunks} chunks in version {self.version}"
            )
        for t in self.tensors:
            if t.offset < 0 or t.offset + t.nbytes > self.total_bytes:
                raise ManifestError(
                    f"tensor {t.name!r} spans [{t.offset}, {t.offset + t.nbytes}) outside the "
                    f"{self.total_bytes}-byte buffer of version {self.version}"
                )

    @property
    def num_chunks(self) -> int:
        return max(1, -(-self.total_bytes // self.chunk_size))

    def chunk_span(self, i: int) -> tuple[int, int]:
        """(offset, length) of chunk ``i``."""
        if not 0 <= i < self.num_chunks:
            raise ManifestError(f"chunk index {i} outside 0..{self.num_chunks - 1} of version {self.version}")
        start = i * self.chunk_size
        return start, max(0, min(self.chunk_size, self.total_bytes - start))

    def with_chunks(self, chunks: int) -> "VersionManifest":
        """The same version cut into ``chunks`` (about equal, ALIGN-multiple) chunks."""
        size = align_up(max(1, -(-self.total_bytes // max(1, chunks))))
        return replace(self, chunk_size=size, checksums=())

    def with_checksums(self, checksums) -> "VersionManifest":
        return replace(self, checksums=tuple(int(c) for c in checksums))

    def for_rank(self, rank: int) -> tuple[TensorEntry, ...]:
        """Entries a tensor-parallel ``rank`` loads: its shards plus the replicated tensors."""
        return tuple(t for t in self.tensors if t.rank is None or t.rank == rank)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> "VersionManifest":
        return cls._from_dict(json.loads(text))

    @classmethod
    def _from_dict(cls, d: dict) -> "VersionManifest":
        if d.get("delta") is not None:
            d["delta"] = DeltaRef(base=int(d["delta"]["base"]), target=cls._from_dict(d["delta"]["target"]))
        d["tensors"] = tuple(
            TensorEntry(**{**t, "shape": tuple(t["shape"])}) for t in d.get("tensors", ())
        )
        d["checksums"] = tuple(d.get("checksums", ()))
        return cls(**d)
