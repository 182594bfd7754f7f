"""Synthetic run directories shaped like what the benchmark and verl leave (console lines as verl prints them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verl_laminar import timeline as tl

T0 = 1_764_000_000.0  # a Unix time: the trainer's start in the synthetic timeline
RESULT = {"date": "2026-12-01T10:00:00+00:00", "commit": "0123456789abcdef0123456789abcdef01234567",
          "machine": {"cpus": 2}, "command": "python -m verl_laminar.bench.e2e", "load_avg_at_start": [0.1]}

SYNC = ("\x1b[36m(TaskRunner pid=11)\x1b[0m step:{step} - actor/pg_loss:np.float64(-0.01) - "
        "critic/score/mean:-0.5 - response_length/mean:45.0 - perf/total_num_tokens:{tok} - "
        "timing_s/gen:np.float64({gen}) - timing_s/old_log_prob:np.float64(17.1) - "
        "timing_s/update_actor:np.float64(29.9) - timing_s/update_weights:np.float64(1.2) - "
        "timing_s/step:np.float64({ts}) - perf/throughput:np.float64(26.1)")
LAMINAR = ("\x1b[36m(TaskRunnerV1 pid=12)\x1b[0m step:{step} - critic/score/mean:-0.9 - "
           "perf/total_num_tokens:{tok} - timing_s/gen:np.float64(0.05) - timing_s/update_actor:np.float64(41.5) - "
           "timing_s/step:np.float64({ts}) - laminar/staleness/hist_0:{h0} - laminar/staleness/hist_1:{h1} - "
           "laminar/trainer/wait_for_data_s:{wd} - laminar/rollout/wait_for_weights_s:{ww} - "
           "laminar/invariant/checked_trajectories:{chk} - training/global_step:{step}")


def sync_line(step: int) -> str:
    return SYNC.format(step=step, tok=4000 + 100 * step, gen=27.0 + step, ts=75.0 + step)


def laminar_line(step: int) -> str:
    return LAMINAR.format(step=step, tok=4200 + 50 * step, ts=42.0, h0=28, h1=4 if step > 1 else 0,
                          wd=0.05 * step, ww=1.5 + 0.1 * step, chk=32 * step)


def stamped(lines: list[tuple[float, str]]) -> str:
    return "".join(f"[{t:9.2f}] {line}\n" for t, line in lines)


def timeline_records(steps: int = 4, replicas: int = 2) -> list:
    recs: list = [tl.RunStart(T0, replicas)]
    t = T0 + 5.0
    recs.append(tl.Publish(0, t))
    for r in range(replicas):
        recs.append(tl.Load(r, -1, 0, t, t + 2.0 + r))
    for step in range(1, steps + 1):
        base = T0 + 10.0 + 40.0 * (step - 1)
        for r in range(replicas):
            version = step - 1
            for i in range(4):  # overlapping trajectories: the picture draws their union
                recs.append(tl.TrajectorySpan(r, version, base + i, base + 10.0 + 5 * i + 3 * r, 60 + i, 30))
            end = base + 25.0 + 3 * r
            recs.append(tl.Load(r, version, version + 1, end + 5.0, end + 7.0))
        recs.append(tl.Publish(step, base + 38.0))
        recs.append(tl.Step(step, base + 39.0, 0.05 * step, 2.0, (0,) * 28 + (1,) * 4))
    return recs


def write_timeline(path: Path, records: list) -> Path:
    with tl.TimelineWriter(path) as w:
        w.write(records)
    return path


@pytest.fixture
def bench_run(tmp_path: Path) -> Path:
    """``python -m verl_laminar.bench.e2e --out RUN`` with sync and laminar, 4 steps each."""
    run = tmp_path / "bench-e2e"
    run.mkdir()
    (run / "sync.log").write_text(stamped([(3.0, "launching ray"), (100.0, sync_line(1)), (176.0, sync_line(2)),
                                           (253.0, sync_line(3)), (331.0, sync_line(4))]))
    (run / "laminar.log").write_text(stamped([(2.0, "(TaskRunnerV1) laminar: 2 standalone replicas"),
                                              (90.0, laminar_line(1)), (131.0, laminar_line(2)),
                                              (172.0, laminar_line(3)), (215.0, laminar_line(4))]))
    write_timeline(run / "laminar" / "checkpoints" / tl.FILE_NAME, timeline_records())
    (run / "sync" / "checkpoints").mkdir(parents=True)
    (run / "result.json").write_text(json.dumps(RESULT))
    return run


@pytest.fixture
def plain_sync_run(tmp_path: Path) -> Path:
    """A plain verl synchronous run: Hydra's main_ppo.log, no time prefix, no timeline."""
    run = tmp_path / "outputs" / "14-10-07"
    run.mkdir(parents=True)
    lines = ["[2026-12-01 14:10:07,123][__main__][INFO] - TaskRunner hostname: host"]
    lines += [sync_line(s) for s in range(1, 5)]
    (run / "main_ppo.log").write_text("\n".join(lines) + "\n")
    return run


@pytest.fixture
def make():
    """The builders above, for tests that need their own variant (conftest helpers are not importable under
    --import-mode=importlib)."""
    import types

    return types.SimpleNamespace(sync_line=sync_line, laminar_line=laminar_line, stamped=stamped,
                                 timeline_records=timeline_records, write_timeline=write_timeline,
                                 result=dict(RESULT), t0=T0)
