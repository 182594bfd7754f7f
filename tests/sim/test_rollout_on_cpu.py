"""A rollout as a continuous-batching queue: timings with hand-computable costs."""

import pytest

from verl_laminar.policy.roofline import DecodeCost
from verl_laminar.sim.costs import RolloutCosts
from verl_laminar.sim.engine import Engine
from verl_laminar.sim.rollout import Rollout
from verl_laminar.sim.workload import Group, Seq

FLAT = DecodeCost(fixed=0.01, mem0=0.0, mem1=0.0, flop_per_seq=0.0, flop1=0.0)  # 10 ms per step, any batch
GROWING = DecodeCost(fixed=0.0, mem0=0.01, mem1=1e-6, flop_per_seq=0.0, flop1=0.0)  # 10 ms + 1 us per cached token


class Sink:
    def __init__(self):
        self.done, self.drained = [], []

    def on_seq_done(self, r, seq, t):
        self.done.append((seq.sid, round(t, 9)))

    def on_drain(self, r, t):
        self.drained.append(round(t, 9))


def make(cost=FLAT, cap=10**6, max_seqs=64, pf=0.0, c_max=0.99, pa=0.0):
    e, sink = Engine(), Sink()
    costs = RolloutCosts(cost, pf, cap, max_seqs, c_max, 8, pa)
    return e, sink, Rollout(0, 0, costs, e, sink)


def seq(sid, prompt, segments):
    return Seq(sid, Group(0), float(prompt), list(segments))


@pytest.mark.parametrize(
    "lengths,expected",
    [
        ([100], [(0, 1.0)]),
        ([100, 50, 200], [(1, 0.5), (0, 1.0), (2, 2.0)]),  # flat step cost: batch size does not matter
    ],
)
def test_flat_cost_finish_times(lengths, expected):
    e, sink, r = make()
    r.submit([seq(i, 10, [n]) for i, n in enumerate(lengths)], 0.0)
    e.run(stop=lambda: False)
    assert sink.done == expected and sink.drained == [expected[-1][1]]


def test_growing_context_integrates_exactly():
    e, sink, r = make(GROWING)
    r.submit([seq(0, 1000, [100])], 0.0)
    e.run(stop=lambda: False)
    # sum over k=0..99 of (0.01 + 1e-6 * (1000 + k + 0.5)) -- context grows by one token per step
    expected = 100 * 0.01 + 1e-6 * (100 * 1000 + 100 * 100 / 2)
    assert sink.done[0][1] == pytest.approx(expected, rel=1e-9)


def test_max_seqs_queues_the_rest_and_prefill_stalls():
    e, sink, r = make(max_seqs=1, pf=0.001)
    r.submit([seq(0, 100, [10]), seq(1, 200, [10])], 0.0)
    e.run(stop=lambda: False)
    # seq 0: 0.1 s prefill + 0.1 s decode; seq 1: 0.2 s prefill + 0.1 s decode after it
    assert sink.done == [(0, 0.2), (1, 0.5)]


def test_admission_stops_below_c_max():
    e, sink, r = make(cap=1000, max_seqs=8, pf=0.0)
    r.submit([seq(0, 600, [100]), seq(1, 500, [100])], 0.0)  # 600 + 500 > 0.99 * 1000: 1 waits
    assert len(r.running) == 1 and len(r.waiting) == 1
    e.run(stop=lambda: False)
    assert sink.done == [(0, 1.0), (1, 2.0)] and r.preemptions == 0


def test_preemption_victim_is_the_newest_admitted():
    e, sink, r = make(cap=1000, max_seqs=8)
    r.submit([seq(0, 300, [500]), seq(1, 300, [500])], 0.0)
    e.run(stop=lambda: False)
    # both reach 1000 tokens together after 200 steps; 1 is preempted, resumes after 0 finishes
    assert r.preemptions == 1
    assert sink.done[0] == (0, 5.0)
    assert sink.done[1][1] == pytest.approx(5.0 + 3.0)  # its remaining 300 tokens after 0 leaves


def test_tool_call_leaves_and_comes_back():
    e, sink, r = make()
    # 100 tokens, a 2 s tool call returning 30 tokens, then 50 tokens
    s = seq(0, 10, [100, (2.0, 30.0, 50.0)])
    r.submit([s], 0.0)
    e.run(stop=lambda: False)
    assert sink.done == [(0, 1.0 + 2.0 + 0.5)]
    assert s.ctx == 10 + 100 + 30 + 50
    assert sink.drained == [3.5]  # not drained while the trajectory was away


def test_take_and_put_running_keep_progress():
    e, sink, r1 = make()
    costs = RolloutCosts(FLAT, 0.0, 10**6, 64, 0.99, 8)
    r2 = Rollout(1, 0, costs, e, sink)
    r1.submit([seq(0, 10, [100]), seq(1, 10, [300])], 0.0)
    e.run(stop=lambda: False, horizon=0.4)
    r1.sync(0.4)
    r2.sync(0.4)
    moved = r1.take_running()
    assert [round(s.remaining, 6) for s in moved] == [60.0, 260.0]
    assert [round(s.ctx, 6) for s in moved] == [50.0, 50.0]
    r2.put_running(moved)
    assert round(r2.ctx()) == 100 and r1.ctx() == 0 and not r1.busy()
    e.run(stop=lambda: False)
    assert sink.done == [(0, 1.0), (1, 3.0)]


def test_interrupt_reprefills_the_whole_context_and_marks_mixed():
    e, sink, r = make(pf=0.001)
    s = seq(0, 100, [200])
    r.submit([s], 0.0)  # 0.1 s prefill
    e.run(stop=lambda: False, horizon=0.6)
    e.now = 0.6
    r.interrupt(version=1, load_s=0.5)  # at 0.6 s: 50 tokens decoded, ctx 150 -> 0.5 + 0.15 s pause
    e.run(stop=lambda: False)
    assert s.mixed and s.version == 1 and s.first_version == 0
    assert sink.done[0][1] == pytest.approx(0.1 + 2.0 + 0.5 + 0.15)


def test_interrupt_rebuild_pays_attention_over_the_square_of_each_context():
    e, sink, r = make(pf=0.001, pa=1e-6)
    s = seq(0, 100, [200])
    r.submit([s], 0.0)  # prompt prefill: 0.001 * 100 + 1e-6 * 100 * (2 * 100 - 100) = 0.11 s
    e.run(stop=lambda: False, horizon=0.61)
    e.now = 0.61
    r.interrupt(version=1, load_s=0.5)  # 50 tokens decoded, L = 150: 0.15 + 1e-6 * 150^2 = 0.1725 s
    e.run(stop=lambda: False)
    assert sink.done[0][1] == pytest.approx(0.11 + 2.0 + 0.5 + 0.1725)
