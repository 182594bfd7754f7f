"""verl's file tracker as the benchmarks read it (``report.tracker_file``) and the launcher that follows it while a
run goes (``bench.launch``): every step from the file, none from the console."""

from __future__ import annotations

import json
import sys

import pytest

from verl_laminar import stepfile
from verl_laminar.bench.launch import run_logged
from verl_laminar.report import tracker_file
from verl_laminar.report.inputs import load_run
from verl_laminar.report.tracker_file import FileTail, parse_line, read_steps


def _line(step: int, **data) -> str:
    return json.dumps({"step": step, "data": data}) + "\n"


def test_a_line_gives_its_step_and_numeric_metrics_only():
    step, metrics = parse_line(_line(3, **{"actor/pg_loss": -0.5, "flag": True, "name": "x", "nan": None}))
    assert step == 3 and metrics == {"actor/pg_loss": -0.5, "flag": 1.0}
    assert parse_line("  \n") is None
    with pytest.raises(ValueError, match="not a verl file-tracker line"):
        parse_line('{"kind": "step"}')


def test_the_tail_returns_whole_lines_once_and_rereads_a_truncated_file(tmp_path):
    path = tmp_path / "m.jsonl"
    tail = FileTail(path)
    assert tail.poll() == []  # not written yet
    whole, half = _line(1, a=1.0), _line(2, a=2.0)
    path.write_text(whole + half[:10])
    assert [s for s, _ in tail.poll()] == [1]  # the half line waits for its end
    with open(path, "a") as f:
        f.write(half[10:])
    assert [s for s, _ in tail.poll()] == [2]
    assert tail.poll() == []
    path.write_text(_line(1, a=9.0))  # a new run truncated it (verl's FileLogger opens with "wb")
    assert tail.poll() == [(1, {"a": 9.0})]


def test_a_torn_last_line_of_a_killed_run_is_skipped(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text(_line(1, a=1.0) + '{"step": 2, "da')
    assert read_steps(path) == {1: {"a": 1.0}}


WRITER = r"""
import json, os, sys, time
path = os.environ["VERL_FILE_LOGGER_PATH"]
print("step:99 - perf/total_num_tokens:123456 - timing_s/step:1.0", flush=True)  # a console line: never read
with open(path, "wb", buffering=0) as f:
    for step in (1, 2, 3):
        time.sleep(0.5)
        f.write((json.dumps({"step": step, "data": {"perf/total_num_tokens": 100.0 * step}}) + "\n").encode())
        print(f"trained step {step}", flush=True)
print("verl_laminar.policy.accounting.InvariantViolation: a test line", flush=True)
"""


def test_the_launcher_reads_steps_from_the_tracker_file_with_arrival_times(tmp_path):
    log = tmp_path / "sync.log"
    seen = []
    rec = run_logged("sync", [sys.executable, "-c", WRITER], {}, log, timeout_s=60,
                     progress=lambda name, event, d: seen.append((event, d.get("step"))))
    assert rec.exit_code == 0
    assert sorted(rec.steps) == [1, 2, 3], "the console's step:99 line must not be read"
    assert rec.steps[3] == {"perf/total_num_tokens": 300.0}
    assert 0.4 < rec.seen_s[1] < rec.seen_s[2] < rec.seen_s[3]  # each stamped when it appeared, ~0.5 s apart
    assert rec.seen_s[3] - rec.seen_s[1] == pytest.approx(1.0, abs=0.5)
    assert rec.violations == 1  # the ledger's error name, read from the console
    assert [e for e in seen if e[0] == "step"] == [("step", 1), ("step", 2), ("step", 3)]
    assert (tmp_path / "sync.metrics.jsonl").is_file()  # verl's own file, where the run was told to write it
    # the stamped steps beside the log: what the report reads for this run (the same times, Unix-based)
    stamped = tracker_file.stamped_path(log)
    lines = stepfile.read_step_file(stamped)
    assert [s.step for s in lines] == [1, 2, 3]
    start = stepfile.run_starts(stamped)[0]
    assert lines[2].t - start == pytest.approx(rec.seen_s[3], abs=1e-3)
    mode = load_run(tmp_path).modes[0]
    assert sorted(mode.record.steps) == [1, 2, 3] and mode.record.seen_s[2] == pytest.approx(rec.seen_s[2], abs=1e-3)
    assert mode.record.violations == 1


def test_the_launcher_says_when_a_run_left_no_tracker_file(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="verl_laminar.bench.e2e"):
        rec = run_logged("x", [sys.executable, "-c", "print('step:1 - a:1')"], {}, tmp_path / "x.log", timeout_s=30)
    assert rec.exit_code == 0 and rec.steps == {}
    assert "no step metrics" in caplog.text and "trainer.logger" in caplog.text
