"""The end-to-end benchmark's parsing and arithmetic, on console text shaped like verl's."""

from __future__ import annotations

import pytest

from verl_laminar.bench import e2e
from verl_laminar.report.runlog import RunRecord, compare, parse_step_line, summarise

LINE = ("\x1b[36m(TaskRunnerV1 pid=1)\x1b[0m step:{step} - perf/total_num_tokens:{tok} - timing_s/step:{ts} - "
        "critic/score/mean:{score} - num_turns/mean:np.float64(2.0) - laminar/staleness/hist_0:{h0} - "
        "laminar/staleness/hist_1:{h1} - laminar/invariant/checked_trajectories:{chk} - note:text")


def _line(step, tok=1000, ts=10.0, score=-0.5, h0=30, h1=2, chk=32):
    return LINE.format(step=step, tok=tok, ts=ts, score=score, h0=h0, h1=h1, chk=chk)


def test_step_line_parses_numbers_and_numpy_reprs_and_skips_text():
    step, m = parse_step_line(_line(3))
    assert step == 3
    assert m["perf/total_num_tokens"] == 1000 and m["num_turns/mean"] == 2.0
    assert "note" not in m
    assert parse_step_line("(TaskRunnerV1) Training Progress: step 3") is None


def test_steady_state_throughput_skips_the_first_step_and_uses_arrival_times():
    run = RunRecord("laminar").feed_all([(100.0, _line(1, tok=5000)), (5.0, "noise"), (130.0, _line(2, tok=1200)),
                                         (150.0, _line(3, tok=800, h1=0))])
    s = summarise(run)
    assert s["trained_tokens"] == 2000 and s["window_wall_s"] == 50.0
    assert s["tokens_per_s"] == pytest.approx(40.0)
    assert s["step_wall_s"] == [30.0, 20.0]
    assert s["startup_s"] == 100.0
    assert s["staleness_hist"] == {"0": 90, "1": 4} and s["staleness_max"] == 1
    assert s["checked_trajectories"] == 32
    assert s["invariant_violations"] == 0


def test_too_few_steps_is_an_error_not_a_number():
    s = summarise(RunRecord("sync").feed_all([(10.0, _line(1))]))
    assert "error" in s and "tokens_per_s" not in s


def test_violations_are_counted_from_the_log_and_speedup_is_a_ratio():
    run = RunRecord("laminar").feed_all([(1.0, "verl_laminar.policy.accounting.InvariantViolation: mixed")])
    assert run.violations == 1
    assert compare({"tokens_per_s": 20.0}, {"tokens_per_s": 30.0}) == pytest.approx(1.5)
    assert compare({"tokens_per_s": None}, {"tokens_per_s": 30.0}) is None


def test_modes_run_the_shared_recipes_with_the_skewed_workload(tmp_path):
    args = e2e.parse_args(["--steps", "3", "--replicas", "4", "--sync-ranks", "2", "--out", str(tmp_path)])
    cmd, env = e2e.mode_command("sync", args)
    assert cmd[1].endswith("run_sync_grpo.sh") and env["N_RANKS"] == "2" and env["SKEW"] == "1"
    cmd, env = e2e.mode_command("laminar", args)
    assert cmd[1].endswith("run_laminar_grpo.sh") and env["REPLICAS"] == "4" and env["PYTHONUNBUFFERED"] == "1"
    cmd, _ = e2e.mode_command("sync_bypass", args)
    assert "algorithm.rollout_correction.bypass_mode=true" in cmd
    with pytest.raises(SystemExit):
        e2e.parse_args(["--modes", "sync,nope"])
    with pytest.raises(SystemExit):
        e2e.parse_args(["--steps", "1"])


def _buffered(step, tok, finished, trained, in_flight):
    return (f"step:{step} - perf/total_num_tokens:{tok} - laminar/trajectories/finished:{finished} - "
            f"laminar/trajectories/trained:{trained} - laminar/trajectories/in_flight:{in_flight}")


def test_a_drained_buffer_is_not_credited_to_the_window():
    # the window (steps 2-3) trains 16 trajectories; 6 of them sat finished in the buffer before it began, and the
    # in-flight count fell by 4 (half of each counted as done before the window): 8 trajectories' worth drained
    run = RunRecord("laminar").feed_all([(10.0, _buffered(1, 4000, finished=8, trained=8, in_flight=6)),
                                         (30.0, _buffered(2, 4000, finished=4, trained=16, in_flight=4)),
                                         (50.0, _buffered(3, 4000, finished=2, trained=24, in_flight=2))])
    s = summarise(run)
    assert s["tokens_per_s_trained"] == pytest.approx(8000 / 40)
    assert s["buffer"]["drained_trajectories"] == pytest.approx(6 + 0.5 * 4)
    assert s["buffer"]["drained_tokens_est"] == pytest.approx(8 * 500)  # 8000 tokens over 16 trajectories
    assert s["tokens_per_s"] == pytest.approx((8000 - 4000) / 40)


def test_a_buffer_that_fills_adds_to_the_window_and_a_sync_log_is_unchanged():
    filling = RunRecord("laminar").feed_all([(0.0, _buffered(1, 1000, 0, 8, 4)), (10.0, _buffered(2, 1000, 8, 16, 4))])
    s = summarise(filling)
    assert s["tokens_per_s"] == pytest.approx((1000 + 8 * 125) / 10)  # 8 trajectories generated, not yet trained
    sync = summarise(RunRecord("sync").feed_all([(0.0, _line(1)), (10.0, _line(2))]))
    assert "buffer" not in sync and sync["tokens_per_s"] == pytest.approx(100.0)


def test_logged_buffer_tokens_replace_the_mean_estimate():
    def line(step, tok, finished, finished_tokens, trained, in_flight):
        return (_buffered(step, tok, finished, trained, in_flight)
                + f" - laminar/trajectories/finished_tokens:{finished_tokens}")
    # 4 finished trajectories drained, which the trainer logged as 3000 tokens (long ones), not 4 x the mean 500
    run = RunRecord("laminar").feed_all([(0.0, line(1, 4000, 6, 4200, 8, 4)), (20.0, line(2, 4000, 2, 1200, 16, 4))])
    s = summarise(run)
    assert s["buffer"]["finished_tokens_logged"] is True
    assert s["buffer"]["drained_tokens_est"] == pytest.approx(3000)
    assert s["tokens_per_s"] == pytest.approx((4000 - 3000) / 20)
