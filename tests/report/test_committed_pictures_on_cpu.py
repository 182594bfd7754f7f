"""The pictures committed in docs/results/ belong to the result JSON that lists them (``"pictures": [...]``):
each exists beside it, is a real picture, and its PNG text chunks name that JSON (Source) and carry its date
and commit (Description), so a picture cannot outlive or drift from the numbers it illustrates."""

from __future__ import annotations

import json
from pathlib import Path

from matplotlib.image import imread

from laminar_testing import REPO
from verl_laminar.report import png_text, write_report

RESULTS = REPO / "docs" / "results"
MIN_BYTES, MIN_SIDE = 5_000, 200


def listing(folder: Path) -> list[tuple[Path, dict]]:
    out = []
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and "pictures" in data:
            out.append((path, data))
    return out


def problems(path: Path, data: dict) -> list[str]:
    """What is wrong with the pictures one result JSON lists (empty: nothing)."""
    pictures = data["pictures"]
    if not isinstance(pictures, list) or not pictures:
        return [f"{path.name}: \"pictures\" must be a non-empty list of file names"]
    if not (data.get("date") and data.get("commit")):
        return [f"{path.name}: a result with pictures needs its date and commit"]
    out = []
    for name in pictures:
        png = path.parent / name
        if not png.is_file():
            out.append(f"{path.name} lists {name}, which is not beside it")
            continue
        if png.stat().st_size < MIN_BYTES:
            out.append(f"{name}: {png.stat().st_size} bytes, too small to be a chart")
        pixels = imread(png)
        if min(pixels.shape[:2]) < MIN_SIDE:
            out.append(f"{name}: {pixels.shape[1]}x{pixels.shape[0]} px, too small to read")
        if not (pixels != pixels[0, 0]).any():
            out.append(f"{name} is blank (every pixel the same)")
        text = png_text(png)
        if text.get("Source") != path.name:
            out.append(f"{name}: Source {text.get('Source')!r}, not {path.name!r}")
        desc = json.loads(text.get("Description", "{}"))
        if (desc.get("date"), desc.get("commit")) != (data["date"], data["commit"]):
            out.append(f"{name}: drawn from date/commit {desc.get('date')}/{desc.get('commit')}, the JSON has "
                       f"{data['date']}/{data['commit']}")
    return out


def test_some_result_lists_its_pictures():
    """Fails until a benchmark result with pictures is committed: the check below must not pass vacuously."""
    assert listing(RESULTS), (f"no JSON in {RESULTS.relative_to(REPO)} lists \"pictures\"; the e2e benchmark "
                              "draws them with verl_laminar.report.write_report and lists them in its result JSON")


def test_listed_pictures_exist_are_real_and_carry_the_jsons_provenance():
    found = [p for path, data in listing(RESULTS) for p in problems(path, data)]
    assert found == []


def test_the_check_accepts_write_reports_pictures_and_catches_a_stale_one(bench_run, tmp_path, make):
    docs = tmp_path / "results"
    docs.mkdir()
    source = docs / "bench_e2e_x.json"
    source.write_text(json.dumps(make.result))
    names = [p.name for p in write_report(bench_run, docs, source, prefix="bench_e2e_x_")]
    source.write_text(json.dumps({**make.result, "pictures": names}))
    assert listing(docs) == [(source, {**make.result, "pictures": names})]
    assert problems(source, json.loads(source.read_text())) == []
    source.write_text(json.dumps({**make.result, "commit": "newer", "pictures": names + ["gone.png"]}))
    found = problems(source, json.loads(source.read_text()))
    assert len(found) == len(names) + 1 and "gone.png, which is not beside it" in found[-1]
