"""Chaos planning (pure): seeded schedules, flag parsing, throughput around faults."""

import pytest

from verl_laminar.chaos.plan import parse_counts, schedule, step_segments, throughput_report


def test_parse_counts_and_errors():
    assert parse_counts("rollout=2, trainer=1") == {"rollout": 2, "trainer": 1}
    with pytest.raises(ValueError, match="unknown fault kind 'gpu'"):
        parse_counts("gpu=1")
    with pytest.raises(ValueError, match="needs a count"):
        parse_counts("rollout")
    with pytest.raises(ValueError, match=">= 0"):
        parse_counts("pool=-1")


def test_schedule_is_seeded_and_complete():
    counts = {"rollout": 3, "relay": 1, "master_relay": 1, "pool": 2, "trainer": 3}
    a = schedule(counts, seed=7, gap_s=(30, 40), relays=4)
    assert a == schedule(counts, seed=7, gap_s=(30, 40), relays=4)
    assert a != schedule(counts, seed=8, gap_s=(30, 40), relays=4)
    assert sorted(f.kind for f in a) == sorted(k for k, n in counts.items() for _ in range(n))
    assert all(30 <= f.gap_s <= 40 for f in a)


@pytest.mark.parametrize("counts,relays,match", [
    ({"relay": 3, "master_relay": 1}, 4, "at least 5 relays"),
    ({"master_relay": 2}, 8, "at most"),
])
def test_schedule_refuses_what_the_runtime_cannot_survive(counts, relays, match):
    with pytest.raises(ValueError, match=match):
        schedule(counts, 0, (1, 2), relays)


def test_throughput_before_during_after():
    # a 10-token step every second until t=10, the trainer killed at t=10.5 and back at t=14, then an
    # 8-token step every second from t=15 (the first one made in 14..15)
    steps = [(t, 10) for t in range(0, 11)] + [(t, 8) for t in range(15, 35)]
    rep = throughput_report(steps, [("trainer", 10.5, 14.0)], t_end=34.0, min_window_s=5, restarts=[14.0])
    # the step in progress at the trainer kill (10..10.5) is lost: the kill's cost, not the window's
    assert rep["before"] == pytest.approx(10.0)
    assert rep["during"] == 0.0
    assert rep["after"][0]["tokens_per_s"] == pytest.approx(8.0)
    assert rep["after"][0]["ratio_to_before"] == pytest.approx(0.8)
    # a relay kill at the same time destroys no step: the window runs to the kill
    rep = throughput_report(steps, [("relay", 10.5, 14.0)], t_end=34.0, min_window_s=5)
    assert rep["before"] == pytest.approx((100 + 8 * 0.5 / 5) / 10.5)  # the 8-token 10..15 step, 0.5 s of it


def test_a_window_cutting_a_step_counts_the_part_inside_it():
    """Steps of 10 s: whole-step counting would see 1 or 2 steps in a 15 s window; the rate is what it is."""
    steps = [(t, 100) for t in range(0, 101, 10)]
    for t0 in (12.0, 15.0, 19.0):
        rep = throughput_report(steps, [("relay", t0 - 1, t0), ("pool", t0 + 15, t0 + 16)], 100.0, min_window_s=5)
        assert rep["after"][0]["tokens_per_s"] == pytest.approx(10.0)


def test_a_trainer_restart_starts_the_next_step_afresh():
    # commits at 0, 10; killed at 15 (its step lost); restarted at 20; commits at 30, 40
    segs = step_segments([(0, 1), (10, 100), (30, 100), (40, 100)], restarts=[20.0])
    assert segs == [(0, 10, 100), (20.0, 30, 100), (30, 40, 100)]


def test_short_after_window_is_not_judged():
    rep = throughput_report([(0.0, 5), (1.0, 5), (5.0, 5)], [("pool", 2.0, 3.0), ("relay", 6.0, 7.0)], 8.0,
                            min_window_s=5)
    assert [a["tokens_per_s"] for a in rep["after"]] == [None, None]
    with pytest.raises(ValueError, match="no training step"):
        throughput_report([], [], 1.0)


def test_the_pre_fault_level_starts_after_warm_up():
    # slow start-up steps (50 tokens in 10 s) then 100 tokens every 10 s; a fault at t=100
    steps = [(0, 1), (10, 50), (20, 50)] + [(t, 100) for t in range(30, 101, 10)]
    rep = throughput_report(steps, [("relay", 100.0, 101.0)], 130.0, min_window_s=5, before_from=20.0)
    assert rep["before"] == pytest.approx(10.0)
    assert throughput_report(steps, [("relay", 100.0, 101.0)], 130.0, min_window_s=5)["before"] < 10.0


def test_window_spread_is_the_workload_noise_floor():
    from verl_laminar.chaos.plan import window_spread
    # 10 s steps alternating 50 and 150 tokens: the long-run level is 10 tokens/s
    steps = [(t, 50 if (t // 10) % 2 else 150) for t in range(0, 201, 10)]
    segs = step_segments(steps)
    one = window_spread(segs, 0, 200, 10.0)
    assert one["min_ratio"] == pytest.approx(0.5) and one["max_ratio"] == pytest.approx(1.5)
    # a window of two steps always holds one of each
    two = window_spread(segs, 0, 200, 20.0)
    assert two["min_ratio"] == pytest.approx(1.0) and two["max_ratio"] == pytest.approx(1.0)
    assert window_spread(segs, 0, 15, 20.0) is None  # the stretch is shorter than one window
    # throughput_report measures it over the pre-fault stretch, with the shortest judged window
    rep = throughput_report(steps, [("relay", 100.0, 101.0), ("pool", 131.0, 132.0)], 200.0, min_window_s=5)
    assert rep["before_window_spread"]["window_s"] == pytest.approx(30.0)
    assert rep["before_window_spread"]["min_ratio"] < 1.0 < rep["before_window_spread"]["max_ratio"]


def test_cli_defaults_leave_windows_long_enough_to_judge_and_refuse_bad_flags(capsys):
    from verl_laminar.chaos.runtime import parse_args
    a = parse_args([])
    # at least 10 faults of every kind, and after-fault windows several ~15 s steps long
    counts = parse_counts(a.faults)
    assert sum(counts.values()) >= 10 and set(counts) == {"rollout", "relay", "master_relay", "pool", "trainer",
                                                           "garbage"}
    assert a.gap_min_s >= 90 and a.baseline_s >= a.gap_min_s and a.tail_s >= a.gap_min_s
    with pytest.raises(SystemExit):
        parse_args(["--gap-min-s", "50", "--gap-max-s", "10"])
    assert "0 <= min <= max" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--faults", "pool=1", "--no-pool"])
    assert "no pool to kill" in capsys.readouterr().err
