"""The report command on synthetic run directories: a benchmark's (two modes, a timeline, a result JSON), a plain
verl sync run's (console log only), and directories with nothing to report on."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
from matplotlib.image import imread

from verl_laminar.report import ReportError, png_text, write_report
from verl_laminar.report.__main__ import main
from verl_laminar.report.write import build_report

PICTURES = ["staleness.png", "timeline.png", "tokens_per_s.png", "waits.png"]


def assert_picture(path):
    pixels = imread(path)
    height, width = pixels.shape[:2]
    assert (width, height) == (1000, 500), path
    assert (pixels != pixels[0, 0]).any(), f"{path.name} is blank"


def test_bench_run_gives_four_pictures_with_the_result_jsons_provenance(bench_run, tmp_path, make):
    out = tmp_path / "pictures"
    paths = write_report(bench_run, out, None)
    assert sorted(p.name for p in paths) == PICTURES and all(p.parent == out for p in paths)
    for p in paths:
        assert_picture(p)
        text = png_text(p)
        assert text["Source"] == "result.json"
        desc = json.loads(text["Description"])
        assert (desc["date"], desc["commit"]) == (make.result["date"], make.result["commit"])
        assert desc["run_dir"] == "bench-e2e" and desc["picture"] == p.stem
    modes = {p.stem: json.loads(png_text(p)["Description"])["modes"] for p in paths}
    assert modes["timeline"] == ["laminar"] and modes["staleness"] == ["laminar"]
    assert sorted(modes["tokens_per_s"]) == ["laminar", "sync"] and sorted(modes["waits"]) == ["laminar", "sync"]


def test_source_json_elsewhere_and_a_prefix(bench_run, tmp_path, make):
    """As the benchmark calls it: pictures beside the result JSON in docs/results, named after it."""
    docs = tmp_path / "docs" / "results"
    docs.mkdir(parents=True)
    source = docs / "bench_e2e_2026-12-01.json"
    source.write_text(json.dumps({**make.result, "commit": "feedbeef"}))
    (bench_run / "result.json").unlink()
    paths = write_report(bench_run, docs, source, prefix="bench_e2e_2026-12-01_")
    assert sorted(p.name for p in paths) == [f"bench_e2e_2026-12-01_{n}" for n in PICTURES]
    for p in paths:
        text = png_text(p)
        assert text["Source"] == source.name and json.loads(text["Description"])["commit"] == "feedbeef"


def test_plain_sync_log_draws_tokens_and_waits_and_says_why_no_timeline(plain_sync_run, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="verl_laminar.report")
    result = build_report(plain_sync_run, tmp_path / "out")
    assert sorted(p.name for p in result.written) == ["tokens_per_s.png", "waits.png"]
    for p in result.written:
        assert_picture(p)
        text = png_text(p)
        assert "Source" not in text  # no result JSON: nothing to name
        assert json.loads(text["Description"])["modes"] == ["main_ppo"]
    assert "laminar_timeline.jsonl" in result.skipped["timeline"] and "staleness" in result.skipped
    assert "timeline not drawn: no laminar_timeline.jsonl" in caplog.text


def test_plain_tokens_per_s_is_tokens_over_step_time(plain_sync_run):
    from verl_laminar.report import series
    from verl_laminar.report.inputs import load_run

    (mode,) = load_run(plain_sync_run).modes
    assert not mode.stamped
    tokens = series.tokens_series(mode.record, mode.stamped)
    assert tokens.steps == (1, 2, 3, 4) and tokens.tokens_per_s[0] == pytest.approx(4100 / 76.0)
    waits = series.wait_series(mode.record)
    assert waits.derived and waits.wait_for_data_s[0] == 28.0 and waits.wait_for_weights_s[0] == 48.0


def test_bench_tokens_per_s_uses_arrival_times(bench_run):
    from verl_laminar.report import series
    from verl_laminar.report.inputs import load_run

    modes = {m.name: m for m in load_run(bench_run).modes}
    lam = series.tokens_series(modes["laminar"].record, modes["laminar"].stamped)
    assert modes["laminar"].stamped and lam.steps == (2, 3, 4)  # step 1 has no previous step line
    assert lam.tokens_per_s == pytest.approx((4300 / 41.0, 4350 / 41.0, 4400 / 43.0))
    assert lam.steady_tokens_per_s == pytest.approx((4300 + 4350 + 4400) / 125.0)
    waits = series.wait_series(modes["laminar"].record)
    assert not waits.derived and waits.wait_for_weights_s == pytest.approx((1.6, 1.7, 1.8, 1.9))


def test_timeline_in_a_plain_run_dir_is_found_below_it(plain_sync_run, tmp_path, make):
    make.write_timeline(plain_sync_run / "ckpt" / "laminar_timeline.jsonl", make.timeline_records())
    paths = write_report(plain_sync_run, tmp_path / "out", None)
    assert "timeline.png" in [p.name for p in paths] and "staleness.png" in [p.name for p in paths]


@pytest.mark.parametrize("setup, missing", [
    (lambda d: None, "no console log (*.log)"),
    (lambda d: (d / "run.log").write_text("Ray started\nTraceback: OOM\n"), "no verl step lines"),
    (lambda d: shutil.rmtree(d), "does not exist"),
])
def test_bad_input_is_a_clear_error_and_exit_code_2(tmp_path, caplog, setup, missing):
    run = tmp_path / "empty"
    run.mkdir()
    setup(run)
    with pytest.raises(ReportError, match=missing.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
        write_report(run, tmp_path / "out", None)
    assert main([str(run), "--out", str(tmp_path / "out")]) == 2
    assert missing in caplog.text
    assert not (tmp_path / "out").exists()


def test_cli_json_lists_the_written_paths(bench_run, tmp_path, capsys):
    assert main([str(bench_run), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert sorted(p.rsplit("/", 1)[-1] for p in got["written"]) == PICTURES
    assert all((bench_run / "report").joinpath(p.rsplit("/", 1)[-1]).is_file() for p in got["written"])
    assert got["skipped"] == {}
