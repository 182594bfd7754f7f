"""``python -m verl_laminar.report RUN_DIR``: PNG pictures of a run (replica timeline, staleness, waits,
tokens/s) from its console logs and, for Laminar, its timeline file (``verl_laminar.timeline``).

Modules: inputs (read a run directory), series (pure, plot-ready), plots (matplotlib, Agg), write
(``write_report``), pngtext (read a PNG's text chunks back). ``write_report`` is imported on first use so
that the pure modules load without matplotlib.
"""

from __future__ import annotations

from typing import Any

from verl_laminar.report.inputs import ReportError
from verl_laminar.report.pngtext import png_text

__all__ = ["ReportError", "build_report", "png_text", "write_report"]


def __getattr__(name: str) -> Any:
    if name in ("write_report", "build_report"):
        from verl_laminar.report import write

        return getattr(write, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
