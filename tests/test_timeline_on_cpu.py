"""The timeline file (verl_laminar.timeline): records round-trip, a torn last line is ignored, router-clock
times become Unix times through the router's own clock pair."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from verl_laminar import timeline as tl

RECORDS = [
    tl.RunStart(1000.0, 2),
    tl.Publish(0, 1001.0),
    tl.Load(0, -1, 0, 1001.5, 1003.0),
    tl.TrajectorySpan(0, 0, 1003.0, 1010.0, 64, 30),
    tl.Step(1, 1011.0, 0.25, 1.5, (0, 0, 1)),
]


def test_records_round_trip_one_json_object_per_line(tmp_path):
    path = tmp_path / "sub" / tl.FILE_NAME
    with tl.TimelineWriter(path) as w:
        w.write(RECORDS)
    lines = path.read_text().splitlines()
    assert [json.loads(line)["kind"] for line in lines] == ["run", "publish", "load", "trajectory", "step"]
    assert json.loads(lines[2]) == {"kind": "load", "replica": 0, "from_version": -1, "version": 0,
                                    "start": 1001.5, "end": 1003.0}
    assert json.loads(lines[4])["staleness"] == [0, 0, 1]
    assert tl.read_timeline(path) == RECORDS


def test_flush_makes_records_readable_while_the_run_goes_on_and_append_continues(tmp_path):
    path = tmp_path / tl.FILE_NAME
    w = tl.TimelineWriter(path)
    w.write(RECORDS[:2])
    w.flush()
    assert tl.read_timeline(path) == RECORDS[:2]  # what a crash right now would leave
    w.close()
    w.close()  # idempotent: the trainer may shut down twice
    with pytest.raises(ValueError, match="closed"):
        w.write(RECORDS[2:])
    with tl.TimelineWriter(path, append=True) as w2:  # a resumed run
        w2.write([tl.RunStart(2000.0, 2)])
    assert tl.read_timeline(path) == RECORDS[:2] + [tl.RunStart(2000.0, 2)]
    with tl.TimelineWriter(path) as w3:  # a fresh run starts the file anew
        w3.write(RECORDS[:1])
    assert tl.read_timeline(path) == RECORDS[:1]


def test_torn_last_line_is_ignored_a_bad_middle_line_is_named(tmp_path):
    path = tmp_path / tl.FILE_NAME
    body = "".join(tl.to_json(r) + "\n" for r in RECORDS)
    path.write_text(body + '{"kind":"trajectory","replica":1,"ver')
    assert tl.read_timeline(path) == RECORDS
    path.write_text(tl.to_json(RECORDS[0]) + "\nnot json\n" + tl.to_json(RECORDS[1]) + "\n")
    with pytest.raises(ValueError, match=r":2: not a timeline record"):
        tl.read_timeline(path)
    path.write_text('{"kind":"load","replica":0}\n')
    with pytest.raises(ValueError, match="load record lacks from_version, version, start, end"):
        tl.read_timeline(path)
    path.write_text('{"kind":"nope"}\n')
    with pytest.raises(ValueError, match="unknown record kind 'nope'"):
        tl.read_timeline(path)


def test_router_times_convert_with_the_routers_own_clock_pair():
    """The router's monotonic clock has its own origin (another node): only its pair converts its times."""
    from verl_laminar.rollout.events import Finished, Loaded, RouterEvents

    events = RouterEvents(
        (5000.0, 1_700_000_100.0),  # router clock 5000 s was Unix 1_700_000_100
        finished=(Finished("g_0", "g", 1, 3, 12.0, 4995.0, 4990.0, 30, 64, 4),
                  Finished("h_0", "h", 0, 3, None, 4999.0, None, 30, 8, 4)),
        loaded=(Loaded(1, 4, 4998.0, 4996.5, 3), Loaded(0, 4, 4999.5, 4999.5, 3)))
    got = tl.records_from_events(events)
    assert got == [
        tl.TrajectorySpan(1, 3, 1_700_000_090.0, 1_700_000_095.0, 64, 30),  # assigned_s, not the worker's start_s
        tl.TrajectorySpan(0, 3, 1_700_000_099.0, 1_700_000_099.0, 8, 30),  # no start known: a point at its end
        tl.Load(1, 3, 4, 1_700_000_096.5, 1_700_000_098.0),
        tl.Load(0, 3, 4, 1_700_000_099.5, 1_700_000_099.5),
    ]
    assert tl.RouterClock((10.0, 100.0)).wall(12.5) == 102.5
    with pytest.raises(TypeError, match="clock"):
        RouterEvents(finished=())  # no pair: no guessing


def test_default_path_is_in_the_checkpoint_dir():
    assert tl.default_path("ckpts") == "ckpts/laminar_timeline.jsonl"


def test_laminar_timeline_path_names_the_file_the_run_writes():
    assert tl.run_path("runs/a/timeline.jsonl", "ckpts") == "runs/a/timeline.jsonl"
    assert tl.run_path(None, "ckpts") == tl.default_path("ckpts")
    # LaminarTrainer opens the file run_path names for the key (read from its source: it imports verl and Ray)
    source = (Path(tl.__file__).parent / "trainer" / "laminar_trainer.py").read_text()
    calls = [ast.unparse(n) for n in ast.walk(ast.parse(source))
             if isinstance(n, ast.Call) and ast.unparse(n.func) == "tl.run_path"]
    assert calls == ["tl.run_path(self.laminar.timeline.path, str(self.config.trainer.default_local_dir))"]


def test_timeline_imports_no_gpu_stack():
    import subprocess
    import sys

    code = ("import sys, verl_laminar.timeline\n"
            "heavy = sorted(m for m in ('torch', 'ray', 'vllm', 'verl', 'matplotlib') if m in sys.modules)\n"
            "assert heavy == [], heavy\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
