"""``write_report``: a run directory -> the report's PNGs, each carrying where it came from.

Dataflow: inputs.load_run (logs, timelines, result JSON) -> series (plot-ready) -> plots (Agg) -> PNG files
with text chunks ``Source`` (the result JSON's file name, when there is one) and ``Description`` (JSON:
date and commit copied from the result JSON, the run directory's name, the modes, the picture).
A picture the run has no data for is skipped with the reason (logged, and in ``ReportResult.skipped``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from verl_laminar import metrics as lm
from verl_laminar import timeline as tl
from verl_laminar.report import plots, series
from verl_laminar.report.inputs import RunInputs, load_run

logger = logging.getLogger(__name__)

PICTURES = ("timeline", "staleness", "waits", "tokens_per_s")


@dataclass
class ReportResult:
    written: list[Path] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # picture -> why it was not drawn


def metadata(run: RunInputs, picture: str, modes: list[str]) -> dict[str, str]:
    result = run.result or {}
    desc = {"date": result.get("date"), "commit": result.get("commit"), "run_dir": run.run_dir.name,
            "modes": modes, "picture": picture}
    out = {"Title": f"{picture}: {run.run_dir.name}", "Description": json.dumps(desc, sort_keys=True)}
    if run.result_path is not None:
        out["Source"] = run.result_path.name
    return out


def _footer(run: RunInputs) -> str:
    result = run.result or {}
    parts = [f"run {run.run_dir.name}"]
    if result.get("commit"):
        parts.append(f"commit {str(result['commit'])[:12]}")
    if result.get("date"):
        parts.append(str(result["date"]))
    if run.result_path is not None:
        parts.append(f"from {run.result_path.name}")
    return ", ".join(parts)


def _figures(run: RunInputs, skipped: dict[str, str]):
    """(file stem, picture, modes drawn, figure) for every picture the run has data for."""
    footer, colors = _footer(run), plots.mode_colors(run.mode_names())
    with_timeline = [m for m in run.modes if m.timeline_path is not None]
    drawn = 0
    for m in with_timeline:
        tl_series = series.timeline_series(m.timeline) if m.timeline_error is None else None
        if tl_series is None:
            skipped[f"timeline:{m.name}"] = m.timeline_error or f"{m.timeline_path.name} of {m.name} holds no " \
                                                                "trajectory or load record"
            continue
        stem = "timeline" if len(with_timeline) == 1 else f"timeline_{m.name}"
        drawn += 1
        yield stem, "timeline", [m.name], plots.timeline(tl_series, m.name, footer)
    if not with_timeline:
        skipped["timeline"] = f"no {tl.FILE_NAME} below {run.run_dir.name} (only a Laminar trainer writes one)"
    elif not drawn:
        skipped.setdefault("timeline", "no timeline had anything to draw")

    counts = {m.name: c for m in run.modes if (c := series.staleness_counts(m.record, m.timeline))}
    if counts:
        yield "staleness", "staleness", list(counts), plots.staleness(counts, footer, colors)
    else:
        skipped["staleness"] = "no laminar/staleness/hist_k step metrics and no timeline step records"
    waits = {m.name: w for m in run.modes if (w := series.wait_series(m.record)) is not None}
    if waits:
        yield "waits", "waits", list(waits), plots.waits(waits, footer, colors)
    else:
        skipped["waits"] = (f"no {lm.TRAINER_WAIT} / {lm.ROLLOUT_WAIT} and no "
                            f"{series.STEP_S} + {series.GEN_S} in the step lines")
    tokens = {m.name: t for m in run.modes if (t := series.tokens_series(m.record, m.stamped)) is not None}
    if tokens:
        yield "tokens_per_s", "tokens_per_s", list(tokens), plots.tokens_per_s(tokens, footer, colors)
    else:
        skipped["tokens_per_s"] = f"no step line carries {series.TOKENS} with a step time"


def build_report(run_dir: Path, out_dir: Path, source_json: Optional[Path] = None,
                 prefix: str = "") -> ReportResult:
    """Raises ``inputs.ReportError`` when the run directory has nothing to report on."""
    run = load_run(Path(run_dir), source_json)
    out = ReportResult()
    for stem, picture, modes, fig in _figures(run, out.skipped):
        path = plots.save(fig, Path(out_dir) / f"{prefix}{stem}.png", metadata(run, picture, modes))
        out.written.append(path)
        logger.info("report: wrote %s (%s)", path, ", ".join(modes))
    for picture, why in out.skipped.items():
        logger.info("report: %s not drawn: %s", picture, why)
    return out


def write_report(run_dir: Path, out_dir: Path, source_json: Optional[Path] = None, *,
                 prefix: str = "") -> list[Path]:
    """The PNGs of ``run_dir`` (a benchmark --out directory or a verl run's directory) into ``out_dir``.

    ``source_json``: the result JSON the pictures belong to (its date and commit go into each PNG); None:
    ``run_dir/result.json`` if there is one. ``prefix`` goes before each file name (``timeline.png`` ...), so
    several reports can share one folder such as ``docs/results/``. Returns the paths written."""
    return build_report(run_dir, out_dir, source_json, prefix).written
