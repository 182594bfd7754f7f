"""Version n as a delta against version n-1 (pure: numpy only, no relay state).

Dataflow: master: ``encode(base=n-1, target=n, word, limit, sink)`` -> delta bytes (or None: send the whole version)
-> the chain -> each relay: a copy of its own n-1 -> ``apply(delta, copy)`` -> n, checked against the master's
``digest`` of n before it is readable.

Encoding. Both versions are compared as fixed-width words (``word``: the smallest element size of the version's
tensors, 2 bytes for bf16), raw bits, so every dtype round-trips exactly (a NaN or a -0.0 included). The buffer is
cut into blocks of ``BLOCK_BYTES``, each encoded on its own in the smallest of:
* ``SAME``   nothing changed: a header only (norms, and most embedding rows, between two steps);
* ``COO``    uint32 word index within the block, then the changed words: ``4 + word`` bytes per change;
* ``BITMAP`` one bit per word, then the changed words: ``words / 8 + word`` per change;
* ``RAW``    the block's bytes (denser than a bitmap pays off).
Why these, from bench.delta_share (docs/relay.md, "What changes between versions"): at the paper's lr 1e-6 about 1%
of a transformer layer's bf16 values change per step, where COO costs 3% of the layer and a bitmap 7.25%; at lr 1e-4
about half change, where COO would exceed the whole layer and a bitmap saves a little. Choosing per block takes the
smallest for each mix (embeddings and norms are ``SAME`` blocks). Blocks bound the encoder's temporaries (a boolean
and an index array of one block, not of a 150 GB model) and keep indices within uint32.

Digest. The digest of a version is its per-chunk CRC32 list (``digest``), which the master computes anyway for every
published version and a receiver for every version it commits: checking a reconstructed version against the
master's list costs no pass beyond what a whole version's receive costs, where a cryptographic hash of the whole
version would cost more CPU than the transfer the delta saved. It catches what the delta's own chunk CRCs cannot:
a wrong or damaged base, a bug in encoding or decoding.
"""

from __future__ import annotations

import struct
import zlib
from typing import Iterable, Optional, Protocol

import numpy as np

MAGIC = b"LMD1"
_HEAD = struct.Struct("<4sB3xQQI")  # magic, word bytes, total bytes, block bytes, block count
_BLOCK = struct.Struct("<B3xQQ")  # format, changed words, payload bytes
SAME, COO, BITMAP, RAW = 0, 1, 2, 3
BLOCK_BYTES = 32 << 20  # 32 MiB: ~4,600 blocks for 145 GB; temporaries of ~100 MB at most
# A delta is sent only when at most this share of the whole version: each relay keeps the newest delta beside its
# version copies (extra host memory) and copies its n-1 to rebuild n, so a delta that saves little network is not
# worth it. At lr 1e-6 the measured delta is ~4% of the version, at 1e-4 ~60-75%: the cut lies far from both.
MAX_DELTA_SHARE = 0.25

_WORDS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_ITEMSIZE = {"bool": 1, "int8": 1, "uint8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "bfloat16": 2, "float16": 2,
             "int16": 2, "float32": 4, "int32": 4, "float64": 8, "int64": 8}


class DeltaError(ValueError):
    """A delta cannot be applied (malformed, or made for a buffer of another size)."""


class Sink(Protocol):
    def write(self, data, /) -> int: ...


def word_size(dtypes: Iterable[str], total_bytes: int) -> int:
    """The comparison word: the smallest element size among ``dtypes`` (2 when none is named, as for bf16), reduced
    until it divides ``total_bytes`` (a word never straddles the buffer's end)."""
    sizes = [_ITEMSIZE.get(d, 1) for d in dtypes]
    w = min(sizes) if sizes else 2
    while w > 1 and total_bytes % w:
        w //= 2
    return w


def block_cost(words: int, changed: int, word: int) -> tuple[int, int]:
    """(format, payload bytes) of the smallest encoding of a block of ``words`` words with ``changed`` changed."""
    if changed == 0:
        return SAME, 0
    options = ((COO, changed * (4 + word)), (BITMAP, (words + 7) // 8 + changed * word), (RAW, words * word))
    return min(options, key=lambda o: o[1])


def _words(buf, word: int) -> np.ndarray:
    return np.frombuffer(buf, dtype=np.uint8).view(_WORDS[word])


def _blocks(n_words: int, block_words: int) -> range:
    return range(0, n_words, block_words)


def estimate(base, target, word: int = 2, block_bytes: int = BLOCK_BYTES) -> int:
    """Bytes ``encode`` would produce (one comparison pass, nothing allocated beyond one block's temporaries)."""
    a, b = _words(base, word), _words(target, word)
    if a.size != b.size:
        raise DeltaError(f"base has {a.nbytes} bytes, target {b.nbytes}: a delta needs two versions of one layout")
    bw = max(1, block_bytes // word)
    total = _HEAD.size
    for s in _blocks(a.size, bw):
        fmt, size = block_cost(min(bw, a.size - s), int(np.count_nonzero(a[s:s + bw] != b[s:s + bw])), word)
        total += _BLOCK.size + size
    return total


def encode(base, target, sink: Sink, word: int = 2, limit: Optional[int] = None,
           block_bytes: int = BLOCK_BYTES) -> Optional[int]:
    """Write the delta that turns ``base`` into ``target`` to ``sink``; returns its size in bytes, or None as soon as
    it would exceed ``limit`` (what was written is then garbage: the caller sends the whole version instead)."""
    a, b = _words(base, word), _words(target, word)
    if a.size != b.size:
        raise DeltaError(f"base has {a.nbytes} bytes, target {b.nbytes}: a delta needs two versions of one layout")
    bw = max(1, block_bytes // word)
    n_blocks = len(_blocks(a.size, bw))
    total = sink.write(_HEAD.pack(MAGIC, word, b.nbytes, bw * word, n_blocks))
    for s in _blocks(a.size, bw):
        old, new = a[s:s + bw], b[s:s + bw]
        diff = old != new
        changed = int(np.count_nonzero(diff))
        fmt, size = block_cost(new.size, changed, word)
        if limit is not None and total + _BLOCK.size + size > limit:
            return None
        total += sink.write(_BLOCK.pack(fmt, changed, size))
        if fmt == COO:
            idx = np.flatnonzero(diff)
            total += sink.write(idx.astype("<u4").tobytes())
            total += sink.write(new[idx].tobytes())
        elif fmt == BITMAP:
            total += sink.write(np.packbits(diff, bitorder="little").tobytes())
            total += sink.write(new[diff].tobytes())
        elif fmt == RAW:
            total += sink.write(new.tobytes())
    return total


def apply(delta, out) -> None:
    """Turn ``out`` (a writable buffer holding a copy of the base) into the target, in place. Raises ``DeltaError``
    on a malformed delta; a delta that parses but was damaged is what the digest check catches."""
    d = np.frombuffer(delta, dtype=np.uint8)
    if d.size < _HEAD.size:
        raise DeltaError(f"delta of {d.size} bytes is shorter than its header")
    magic, word, total_bytes, block_bytes, n_blocks = _HEAD.unpack_from(d, 0)
    if magic != MAGIC or word not in _WORDS or block_bytes < word:
        raise DeltaError(f"not a version delta (magic {magic!r}, word {word}, block {block_bytes})")
    dst = np.frombuffer(out, dtype=np.uint8)
    if dst.size != total_bytes:
        raise DeltaError(f"delta is for {total_bytes} bytes, the buffer has {dst.size}")
    w = dst.view(_WORDS[word])
    bw, pos = block_bytes // word, _HEAD.size
    for k in range(n_blocks):
        if pos + _BLOCK.size > d.size:
            raise DeltaError(f"delta ends inside block {k}'s header")
        fmt, changed, size = _BLOCK.unpack_from(d, pos)
        pos += _BLOCK.size
        s = k * bw
        block = w[s:s + bw]
        if pos + size > d.size or s >= w.size and fmt != SAME:
            raise DeltaError(f"block {k} ({size} bytes) runs past the delta or the buffer")
        payload = d[pos:pos + size]
        pos += size
        if fmt == SAME:
            continue
        if fmt == COO and size == changed * (4 + word):
            idx = payload[:4 * changed].view("<u4")
            if changed and int(idx.max()) >= block.size:
                raise DeltaError(f"block {k} has an index past its {block.size} words")
            block[idx] = payload[4 * changed:].view(block.dtype)
        elif fmt == BITMAP and size == (block.size + 7) // 8 + changed * word:
            nbits = (block.size + 7) // 8
            mask = np.unpackbits(payload[:nbits], count=block.size, bitorder="little").astype(bool)
            if int(np.count_nonzero(mask)) != changed:
                raise DeltaError(f"block {k}'s bitmap marks {int(np.count_nonzero(mask))} words, header {changed}")
            block[mask] = payload[nbits:].view(block.dtype)
        elif fmt == RAW and size == block.nbytes:
            block[:] = payload.view(block.dtype)
        else:
            raise DeltaError(f"block {k}: format {fmt} with {changed} changes cannot be {size} bytes")
    if pos != d.size:
        raise DeltaError(f"{d.size - pos} bytes after the last block")


def digest(buf, chunk_size: int) -> tuple[int, ...]:
    """The version's digest: CRC32 of each ``chunk_size`` chunk (the master's manifest checksums)."""
    view = memoryview(buf).cast("B")
    return tuple(zlib.crc32(view[o:o + chunk_size]) & 0xFFFFFFFF for o in range(0, max(1, len(view)), chunk_size))


class BytesSink:
    """An in-memory sink (tests and small versions)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data) -> int:
        self.parts.append(bytes(data))
        return len(self.parts[-1])

    def getvalue(self) -> bytes:
        return b"".join(self.parts)
