"""Plot-ready series: a replica's lane is generating (union of its trajectories), loading, idle; idle carries
the version the replica holds; staleness falls back to the timeline's step records."""

from __future__ import annotations

from verl_laminar import timeline as tl
from verl_laminar.report.runlog import RunRecord
from verl_laminar.report.series import GENERATING, IDLE, LOADING, Segment, staleness_counts, timeline_series, union


def test_union_merges_overlapping_and_touching_intervals():
    assert union([(5, 6), (0, 2), (1, 3), (3, 4), (8, 9)]) == [(0, 4), (5, 6), (8, 9)]
    assert union([]) == []


def test_lane_states_cover_the_run_without_gaps():
    recs = [tl.RunStart(100.0, 2), tl.Publish(0, 101.0), tl.Load(0, -1, 0, 101.0, 103.0),
            tl.TrajectorySpan(0, 0, 104.0, 110.0, 5, 1), tl.TrajectorySpan(0, 0, 105.0, 112.0, 5, 1),
            tl.Load(0, 0, 1, 113.0, 114.0), tl.TrajectorySpan(0, 1, 115.0, 118.0, 5, 1), tl.Publish(1, 112.5),
            tl.Step(1, 120.0, 0.1, 1.0, (0, 1))]
    s = timeline_series(recs)
    assert s.origin == 100.0 and s.end == 20.0 and s.publications == ((1.0, 0), (12.5, 1))
    lane0, lane1 = s.lanes
    assert lane0.segments == (
        Segment(0.0, 1.0, IDLE, None), Segment(1.0, 3.0, LOADING, 0), Segment(3.0, 4.0, IDLE, 0),
        Segment(4.0, 12.0, GENERATING, 0), Segment(12.0, 13.0, IDLE, 0), Segment(13.0, 14.0, LOADING, 1),
        Segment(14.0, 15.0, IDLE, 1), Segment(15.0, 18.0, GENERATING, 1), Segment(18.0, 20.0, IDLE, 1))
    assert lane1.replica == 1 and lane1.segments == (Segment(0.0, 20.0, IDLE, None),)  # in the header, no events


def test_nothing_to_draw_and_staleness_from_the_timeline():
    assert timeline_series([tl.RunStart(1.0, 2), tl.Publish(0, 2.0)]) is None
    steps = [tl.Step(1, 5.0, 0.0, 0.0, (0, 0, 1)), tl.Step(2, 9.0, 0.0, 0.0, (1, 2))]
    assert staleness_counts(RunRecord("x"), steps) == {0: 2, 1: 2, 2: 1}
    logged = RunRecord("x").feed_all([(1.0, "step:1 - laminar/staleness/hist_0:3 - laminar/staleness/hist_2:1"),
                                      (2.0, "step:2 - laminar/staleness/hist_0:4")])
    assert staleness_counts(logged, steps) == {0: 7, 2: 1}  # the logged metrics win
