"""The step file (``verl_laminar.stepfile``): every step's numeric metrics, read back without a console; a resumed
run's steps told apart from its predecessor's; the report takes a run's steps from it when its console has none."""

from __future__ import annotations

import math

import numpy as np
import pytest

from verl_laminar import stepfile
from verl_laminar.report.runlog import RunRecord


def _write(path, resumed: bool, t0: float, steps: dict) -> None:
    w = stepfile.StepFileWriter(path, append=resumed, t=t0)
    for step, (t, metrics) in steps.items():
        w.write(step, t, metrics)
    w.close()


def test_numbers_of_every_kind_are_kept_and_the_rest_dropped(tmp_path):
    path = tmp_path / stepfile.FILE_NAME
    _write(path, False, 100.0, {1: (110.0, {"a": 1, "b": np.float64(2.5), "c": np.int64(3), "d": np.array(4.0),
                                            "nan": float("nan"), "inf": float("inf"), "flag": True,
                                            "text": "x", "counts": {"k": 1}, "list": [1, 2]})})
    (line,) = stepfile.read_step_file(path)
    assert (line.step, line.t, line.run) == (1, 110.0, 0)
    m = line.metrics
    assert {k: m[k] for k in ("a", "b", "c", "d", "inf", "flag")} == {"a": 1.0, "b": 2.5, "c": 3.0, "d": 4.0,
                                                                      "inf": math.inf, "flag": 1.0}
    assert math.isnan(m["nan"]) and not {"text", "counts", "list"} & set(m)


def test_a_resumed_run_appends_and_reads_apart(tmp_path):
    path = tmp_path / stepfile.FILE_NAME
    _write(path, False, 0.0, {1: (10.0, {"x": 1}), 2: (20.0, {"x": 2})})
    _write(path, True, 50.0, {3: (60.0, {"x": 3}), 4: (75.0, {"x": 4})})
    assert [(s.step, s.run) for s in stepfile.read_step_file(path)] == [(1, 0), (2, 0), (3, 1), (4, 1)]
    every = RunRecord.from_step_file("laminar", path)
    assert sorted(every.steps) == [1, 2, 3, 4]
    last = RunRecord.from_step_file("laminar", path, last_run_only=True)
    assert sorted(last.steps) == [3, 4] and last.steps[4] == {"x": 4.0}
    assert last.seen_s == {3: 0.0, 4: 15.0}
    assert RunRecord.from_step_file("laminar", path, started=0.0).seen_s[2] == 20.0


def test_a_torn_last_line_is_ignored_and_a_bad_line_named(tmp_path):
    path = tmp_path / stepfile.FILE_NAME
    _write(path, False, 0.0, {1: (1.0, {"x": 1})})
    with open(path, "a") as f:
        f.write('{"kind": "step", "step": 2, "t"')
    assert [s.step for s in stepfile.read_step_file(path)] == [1]
    path.write_text('{"kind": "run", "t": 0}\nnot json\n{"kind": "run", "t": 1}\n')
    with pytest.raises(ValueError, match=r"laminar_metrics.jsonl:2: not a step-file line"):
        stepfile.read_step_file(path)


def test_a_closed_writer_refuses(tmp_path):
    w = stepfile.StepFileWriter(tmp_path / stepfile.FILE_NAME, append=False, t=0.0)
    w.close()
    with pytest.raises(ValueError, match="is closed"):
        w.write(1, 1.0, {"x": 1})


def test_the_report_reads_a_run_whose_console_tracker_was_off(tmp_path):
    from verl_laminar.report.inputs import load_run

    (tmp_path / "laminar.log").write_text("INFO: a run with trainer.logger=[] prints no step line\n")
    _write(tmp_path / "checkpoints" / stepfile.FILE_NAME, False, 0.0,
           {1: (10.0, {"laminar/step_tokens": 100}), 2: (20.0, {"laminar/step_tokens": 120})})
    run = load_run(tmp_path)
    (mode,) = run.modes
    assert sorted(mode.record.steps) == [1, 2] and mode.stamped
    assert mode.record.steps[2]["laminar/step_tokens"] == 120.0
