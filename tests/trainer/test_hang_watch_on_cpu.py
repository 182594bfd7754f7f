"""The hang watch (trainer.hang) and its pure rule (policy.failover.hung_replicas): a replica that holds requests
and streams nothing for dead_after_s is hung and killed once; an idle one, one that just became busy after a long
idle, and one whose tokens keep coming are not."""

from __future__ import annotations

import time

import pytest

from verl_laminar.policy.failover import HeartbeatPolicy, hung_replicas, unanswered_replicas
from verl_laminar.pool.partial import PartialPool
from verl_laminar.trainer.hang import HangWatch, PingProbe

POLICY = HeartbeatPolicy(interval_s=1.0, dead_after_s=5.0)


def test_the_rule_needs_both_a_long_busy_spell_and_a_long_silence():
    busy = {0: 6.0, 1: 6.0, 2: 1.0}
    silent = {0: 6.0, 1: 0.5, 2: 100.0}
    assert hung_replicas(busy, silent, POLICY) == [0]  # 1 streams, 2 only just took requests
    # busy and no token streamed yet (a new replica's cold first tokens, or any after a pool restart): hung only
    # after first_token_after_s (3 x dead_after_s)
    assert POLICY.first_token_after_s == 15.0
    assert hung_replicas({3: 9.0}, {}, POLICY) == []
    assert hung_replicas({3: 15.0}, {}, POLICY) == [3]
    assert hung_replicas({}, {0: 100.0}, POLICY) == []  # idle: silence is not a hang


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_the_watch_kills_a_stuck_replica_once_and_leaves_the_streaming_one():
    clock, killed = Clock(), []
    state = {"busy": [0, 1], "silence": {0: 0.0, 1: 0.0}}
    watch = HangWatch(POLICY, lambda: state["busy"], lambda busy: {r: state["silence"][r] for r in busy if r in state["silence"]}, killed.append, clock)
    for t in range(0, 5):  # both busy; replica 0 stops streaming at t=0, replica 1 streams on
        clock.t = float(t)
        state["silence"] = {0: float(t), 1: 0.2}
        assert watch.check() == []
    clock.t = 5.0
    state["silence"] = {0: 5.0, 1: 0.2}
    assert watch.check() == [0] and killed == [0]
    clock.t = 9.0
    state["silence"] = {0: 9.0, 1: 0.2}
    assert watch.check() == [] and killed == [0]  # once: the router's failover takes it from here


def test_a_replica_that_takes_requests_after_a_long_idle_is_given_dead_after_s():
    clock, killed = Clock(), []
    state = {"busy": [], "silence": {0: 500.0}}
    watch = HangWatch(POLICY, lambda: state["busy"], lambda busy: {r: state["silence"][r] for r in busy if r in state["silence"]}, killed.append, clock)
    clock.t = 100.0
    assert watch.check() == []
    state["busy"] = [0]  # the router counted its requests before their pool entries opened
    clock.t = 101.0
    assert watch.check() == []
    clock.t = 104.0
    state["busy"] = []  # its batch ended: the busy spell is over
    assert watch.check() == []
    state["busy"] = [0]
    clock.t = 108.0
    assert watch.check() == [] and killed == []  # busy again only since 108


def test_the_pool_clocks_each_replicas_progress():
    pool = PartialPool()
    pool.open("a", "g", 0, [1], {}, replica_id=3)
    pool.open("b", "g", 0, [1], {}, replica_id=4)
    # requests opened, no token yet: a cold engine (a replacement's first forward) is not clocked, so the watch
    # gives it the longer first-token deadline (a CI run killed a healthy replacement 10.6 s after its first
    # requests opened, before its first token)
    assert pool.silence() == {}
    pool.append("a", 0, [5], [-0.1], offset=0)
    time.sleep(0.05)
    pool.append("b", 0, [5], [-0.1], offset=0)
    s = pool.silence()
    assert set(s) == {3, 4} and s[3] > s[4] >= 0.0
    time.sleep(0.05)
    pool.append("a", 0, [6], [-0.1], offset=1)
    s = pool.silence()
    assert s[3] < s[4]  # the chunk is replica 3's heartbeat
    pool.open("c", "g", 0, [1], {}, replica_id=4)
    assert pool.silence()[4] < s[4]  # once streaming, a new request counts as progress too
    assert pool.streamed_on(3) == 1 and pool.streamed_on(4) == 1 and pool.streamed_on(3, min_tokens=3) == 0
    # of given groups only; a finished entry its client has not closed yet is no work a death would leave
    assert pool.streamed_on(3, groups=["g"]) == 1 and pool.streamed_on(3, groups=["other"]) == 0
    pool.finish("a")
    assert pool.streamed_on(3) == 0 and pool.streamed_on(4) == 1


def test_after_a_pool_restart_a_busy_replica_is_silent_only_since_the_restart(tmp_path):
    log = str(tmp_path / "pool.log")
    pool = PartialPool(log)
    pool.open("a", "g", 0, [1], {}, replica_id=3)
    pool.append("a", 0, [4], [-0.1], offset=0)
    time.sleep(0.2)
    restarted = PartialPool(log)  # what Ray's restart does: a new process replays the log
    # nothing of the replayed log counts as fresh: no replica has streamed a token yet, so the watch gives each the
    # longer first-token deadline instead of taking the restart's gap for a hang
    assert restarted.silence([3, 5]) == {}
    assert restarted.get("a").replica_id == 3  # the entry itself came back
    assert pool.silence([3])[3] >= 0.2 and pool.silence([5]) == {}
    restarted.append("a", 0, [5], [-0.1], offset=1)
    assert set(restarted.silence([3, 5])) == {3}


def test_the_watch_survives_a_failed_look():
    calls = []

    def busy():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("router restarting")
        return []

    watch = HangWatch(HeartbeatPolicy(interval_s=0.01, dead_after_s=1.0), busy, lambda b: {}, lambda r: None).start()
    deadline = time.monotonic() + 10
    while len(calls) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    watch.stop()
    assert len(calls) >= 3


def test_replica_fault_is_checked():
    from verl_laminar.config.schema import FaultInjectionConfig

    assert FaultInjectionConfig(replica_fault="hang").replica_fault == "hang"
    with pytest.raises(ValueError, match="replica_fault"):
        FaultInjectionConfig(replica_fault="freeze")


def test_an_idle_replica_whose_server_leaves_a_ping_unanswered_is_hung():
    # stopped between two batches, a replica holds no request, so its silence says nothing (a chaos run's SIGSTOP
    # landed there and was found only by the refresh's 120 s load deadline); its server's ping never comes back
    assert POLICY.ping_after_s == 15.0
    assert unanswered_replicas({0: 14.9, 1: 15.0, 2: 0.0}, POLICY) == [1]


def test_the_probe_sends_one_ping_at_a_time_and_clocks_the_unanswered_one():
    clock, sent, answered = Clock(), [], set()

    def send(rid):
        sent.append(rid)
        return (rid, len(sent))  # a future stand-in

    probe = PingProbe(send, ready=lambda refs: {r for r in refs if r[0] in answered}, clock=clock)
    assert probe([0, 1]) == {0: 0.0, 1: 0.0} and sent == [0, 1]
    clock.t = 4.0
    answered.add(0)  # 0 answers; 1 (stopped) never does
    assert probe([0, 1]) == {0: 0.0, 1: 4.0} and sent == [0, 1, 0]  # a new ping to 0 only
    clock.t = 20.0
    assert probe([0, 1]) == {0: 0.0, 1: 20.0}


def test_the_watch_kills_an_idle_replica_that_does_not_answer_and_leaves_the_busy_and_the_answering_ones():
    clock, killed = Clock(), []
    waits = {0: 0.0, 1: 0.0}
    asked = []

    def ping_waits(idle):
        asked.append(list(idle))
        return {r: waits[r] for r in idle}

    watch = HangWatch(POLICY, lambda: [2], lambda busy: {r: 0.1 for r in busy}, killed.append, clock,
                      live=lambda: [0, 1, 2], ping_waits=ping_waits)
    assert watch.check() == [] and asked == [[0, 1]]  # the busy replica is judged by its stream, not pinged
    waits[1] = 16.0
    clock.t = 16.0
    assert watch.check() == [1] and killed == [1]
    assert watch.check() == [] and killed == [1] and asked[-1] == [0]  # killed once, not pinged again
