"""png_text reads back what matplotlib writes (tEXt, iTXt for non-Latin-1 text) and zTXt, and refuses non-PNGs."""

from __future__ import annotations

import struct
import zlib

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from verl_laminar.report import png_text


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def test_text_chunks_written_by_matplotlib_read_back(tmp_path):
    fig = Figure(figsize=(2, 1), dpi=50)
    FigureCanvasAgg(fig)
    fig.subplots().plot([0, 1], [1, 0])
    path = tmp_path / "p.png"
    fig.savefig(path, metadata={"Source": "bench.json", "Description": '{"commit": "abc"}', "Comment": "Δt ≥ 0"})
    text = png_text(path)
    assert text["Source"] == "bench.json" and text["Description"] == '{"commit": "abc"}'
    assert text["Comment"] == "Δt ≥ 0"  # not Latin-1: matplotlib writes an iTXt chunk
    assert text["Software"].startswith("Matplotlib")


def test_ztxt_and_compressed_itxt(tmp_path):
    png = (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", b"\0" * 13)
           + _chunk(b"zTXt", b"Source\0\0" + zlib.compress(b"r.json"))
           + _chunk(b"iTXt", b"Title\0\x01\0en\0\0" + zlib.compress("délai".encode()))
           + _chunk(b"IEND", b""))
    (tmp_path / "z.png").write_bytes(png)
    assert png_text(tmp_path / "z.png") == {"Source": "r.json", "Title": "délai"}


def test_not_a_png_or_truncated(tmp_path):
    (tmp_path / "x.png").write_bytes(b"GIF89a")
    with pytest.raises(ValueError, match="not a PNG"):
        png_text(tmp_path / "x.png")
    (tmp_path / "t.png").write_bytes(b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", b"\0" * 13)[:10])
    with pytest.raises(ValueError, match="truncated"):
        png_text(tmp_path / "t.png")
