"""Chaos planning (pure): seeded schedules, flag parsing, throughput around faults."""

import pytest

from verl_laminar.chaos.plan import parse_counts, schedule, throughput_report


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
    # 10 tokens/s before the fault at t=10, nothing while it recovers (10..14), 8 tokens/s after
    steps = [(t, 10) for t in range(0, 10)] + [(t, 8) for t in range(14, 34)]
    rep = throughput_report(steps, [("trainer", 10.0, 14.0)], t_end=34.0, min_window_s=5)
    assert rep["before"] == pytest.approx(10.0)
    assert rep["during"] == 0.0
    assert rep["after"][0]["tokens_per_s"] == pytest.approx(8.0)
    assert rep["after"][0]["ratio_to_before"] == pytest.approx(0.8)


def test_short_after_window_is_not_judged():
    rep = throughput_report([(0.0, 5), (1.0, 5), (5.0, 5)], [("pool", 2.0, 3.0), ("relay", 6.0, 7.0)], 8.0,
                            min_window_s=5)
    assert [a["tokens_per_s"] for a in rep["after"]] == [None, None]
    with pytest.raises(ValueError, match="no training step"):
        throughput_report([], [], 1.0)
