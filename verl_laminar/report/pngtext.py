"""The text chunks of a PNG (tEXt, zTXt, iTXt), read with the standard library only.

The report writes each picture's provenance there (``Source``: the result JSON, ``Description``: a JSON string
with its date and commit); the tests of ``docs/results/`` read it back with this.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Union

SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _text(kind: bytes, data: bytes) -> tuple[str, str]:
    key, _, rest = data.partition(b"\0")
    if kind == b"tEXt":
        return key.decode("latin-1"), rest.decode("latin-1")
    if kind == b"zTXt":  # compression method byte (0: zlib), then the compressed text
        return key.decode("latin-1"), zlib.decompress(rest[1:]).decode("latin-1")
    # iTXt: compression flag, method, language tag \0, translated keyword \0, UTF-8 text
    compressed, body = rest[0], rest[2:]
    _lang, _, body = body.partition(b"\0")
    _translated, _, body = body.partition(b"\0")
    if compressed:
        body = zlib.decompress(body)
    return key.decode("latin-1"), body.decode("utf-8")


def png_text(path: Union[str, Path]) -> dict[str, str]:
    """Keyword -> text of every text chunk; raises ValueError if the file is not a PNG or is truncated."""
    data = Path(path).read_bytes()
    if not data.startswith(SIGNATURE):
        raise ValueError(f"{path}: not a PNG (no PNG signature)")
    out: dict[str, str] = {}
    pos = len(SIGNATURE)
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if len(body) < length:
            raise ValueError(f"{path}: chunk {kind!r} at byte {pos} is truncated")
        if kind in (b"tEXt", b"zTXt", b"iTXt"):
            key, value = _text(kind, body)
            out[key] = value
        if kind == b"IEND":
            return out
        pos += 12 + length  # length, type, data, CRC
    raise ValueError(f"{path}: no IEND chunk (truncated PNG)")
