"""Accounting: per-trajectory versions and staleness, invariants that raise, throughput, waits."""

import random

import pytest

from verl_laminar.buffer.experience import ExperienceBuffer, Trajectory
from verl_laminar.policy import dispatch as d
from verl_laminar.policy.accounting import (
    Accounting,
    InvariantViolation,
    Ledger,
    ReplicaTimeline,
    ThroughputMeter,
    TrajectoryRecord,
    WaitAccumulator,
    single_version,
)


def rec(key="g_0", group="g", replica=0, version=1, n=3, start=0.0, finish=1.0, p=10, r=5):
    return TrajectoryRecord(key, group, replica, version, start, finish, p, r, n)


@pytest.mark.parametrize(
    "versions,expected,match",
    [
        ([3], 3, None),
        ([3, 3, 3], 3, None),
        ([3, 4], None, "mixes weight versions \\[3, 4\\]"),
        ([3, None], None, "unlabelled"),
        ([], None, "unlabelled"),
    ],
)
def test_single_version(versions, expected, match):
    if match is None:
        assert single_version("k", versions) == expected
    else:
        with pytest.raises(InvariantViolation, match=match):
            single_version("k", versions)


@pytest.mark.parametrize("version,n,expected", [(1, 1, 0), (1, 3, 2), (0, 4, 4)])
def test_staleness_is_n_minus_j_at_finish(version, n, expected):
    assert Ledger().finish(rec(version=version, n=n)) == expected


def test_negative_staleness_and_bad_records_raise():
    with pytest.raises(ValueError, match="newer"):
        Ledger().finish(rec(version=5, n=4))
    with pytest.raises(ValueError, match="before it starts"):
        rec(start=2.0, finish=1.0)
    with pytest.raises(ValueError, match="token counts"):
        rec(p=-1)


def test_ledger_lifecycle_and_counts():
    led = Ledger()
    led.start("g_0", "g", 0, 1)
    led.start("g_1", "g", 0, 1)
    assert led.counts() == {"in_flight": 2, "finished": 0, "trained": 0, "discarded": 0, "finished_tokens": 0}
    led.finish(rec("g_0"))
    led.finish(rec("g_1", replica=2, r=7))  # moved by repack: same version, another replica
    assert led.counts()["finished_tokens"] == (10 + 5) + (10 + 7)  # prompt + response of each untrained one
    assert [r.key for r in led.trained(["g_0", "g_1"], step=4)] == ["g_0", "g_1"]
    assert led.counts() == {"in_flight": 0, "finished": 0, "trained": 2, "discarded": 0, "finished_tokens": 0}
    led.check_nothing_lost()


@pytest.mark.parametrize(
    "events,match",
    [
        (lambda L: (L.start("a", "g", 0, 1), L.start("a", "g", 0, 1)), "started twice"),
        (lambda L: (L.finish(rec("a")), L.finish(rec("a"))), "finished twice"),
        (lambda L: (L.finish(rec("a")), L.trained(["a"], 1), L.finish(rec("a"))), "finished twice"),
        (lambda L: (L.finish(rec("a")), L.trained(["a"], 1), L.trained(["a"], 2)), "trained at step 1 and again"),
        (lambda L: (L.finish(rec("a")), L.trained(["a", "a"], 1)), "twice"),
        (lambda L: L.trained(["never"], 1), "never finished"),
        (lambda L: (L.finish(rec("a", version=1)), L.finish(rec("b", version=2))), "group 'g' mixes versions 1 and 2"),
        (lambda L: (L.start("a", "g", 0, 1), L.finish(rec("a", version=0))), "started as"),
        (lambda L: (L.finish(rec("a")), L.trained(["a"], 1), L.discard("a", "x")), "cannot be discarded"),
    ],
)
def test_invariant_violations_raise(events, match):
    with pytest.raises(InvariantViolation, match=match):
        events(Ledger())


def test_lost_trajectories_are_reported():
    led = Ledger()
    led.start("a", "g", 0, 1)
    led.finish(rec("b"))
    led.start("c", "h", 0, 1)
    led.discard("c", "failed group")
    with pytest.raises(InvariantViolation, match="2 trajectories.*\\['a', 'b'\\]"):
        led.check_nothing_lost()


def test_throughput_is_step_tokens_over_publication_interval():
    m = ThroughputMeter()
    m.publish(0, 10.0)
    m.step_tokens(1, 600)
    assert m.tokens_per_s(1) is None  # version 1 not published yet
    m.publish(1, 13.0)
    assert m.tokens_per_s(1) == pytest.approx(200.0) and m.interval_s(1) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="not after version 1"):
        m.publish(1, 14.0)
    with pytest.raises(ValueError, match="not after version 1"):
        m.publish(2, 12.0)


def test_replica_timeline_never_goes_back():
    tl = ReplicaTimeline()
    tl.record(0, 0, 0.0)
    tl.record(1, 0, 0.0)
    tl.record(0, 2, 5.0)
    assert tl.current() == {0: 2, 1: 0} and tl.history(0) == ((0.0, 0), (5.0, 2))
    with pytest.raises(InvariantViolation, match="replica 0 went from version 2"):
        tl.record(0, 1, 6.0)


def test_wait_accumulator_interval_and_total():
    w = WaitAccumulator()
    w.begin("r0", 1.0)
    w.begin("r1", 1.5)
    assert w.end("r0", 3.0) == 2.0
    w.end("r1", 2.0)
    assert w.take_interval() == pytest.approx(2.5) and w.take_interval() == 0.0
    assert w.total_s == pytest.approx(2.5)
    with pytest.raises(ValueError, match="never began"):
        w.end("r9", 1.0)
    w.begin("r0", 4.0)
    with pytest.raises(ValueError, match="already began"):
        w.begin("r0", 5.0)


def test_snapshot_reports_the_trained_step():
    acc = Accounting()
    acc.throughput.publish(2, 0.0)
    for k, v in [("a", 3), ("b", 3), ("c", 1)]:
        acc.ledger.finish(rec(k, group=k, version=v, n=3))
    recs = acc.train_step(3, ["a", "b", "c"])
    acc.throughput.publish(3, 4.0)
    acc.replicas.record(0, 3, 4.0)
    acc.trainer_wait.begin("trainer", 0.0)
    acc.trainer_wait.end("trainer", 0.5)
    snap = acc.snapshot(3, recs)
    assert snap.staleness.hist == ((0, 2), (1, 0), (2, 1)) and snap.staleness_max_all == 2
    assert snap.step_tokens == 45 and snap.tokens_per_s == pytest.approx(45 / 4)
    assert snap.trainer_wait_s == 0.5 and snap.replica_versions == {0: 3}
    assert snap.counts["trained"] == 3
    assert acc.snapshot(4, []).staleness_max_all == 2  # run-wide max survives an empty step


def test_random_runs_end_to_end_nothing_lost_nothing_mixed():
    """Property over random schedules: dispatcher -> replicas -> buffer -> ledger -> trainer.

    Every response of every group is generated by its pinned replica at the pinned version over several
    turns; groups are trained only complete, once, and at the end nothing is lost.
    """
    rng = random.Random(1)
    for trial in range(25):
        n, replicas = rng.randint(1, 4), rng.randint(1, 4)
        cfg = d.DispatchPolicy(rng.randint(1, 3))
        state, queue, newest = d.initial_state(range(replicas), 0), [], 0
        buf, acc = ExperienceBuffer(clock=lambda: 0.0), Accounting()
        turns_left: dict[str, int] = {}
        t, submitted, step = 0.0, 0, 0
        for _ in range(120):
            t += 1.0
            if rng.random() < 0.4:
                gid = f"{trial}-{submitted}"
                submitted += 1
                queue.append(gid)
                buf.expect(gid, n)
            plan = d.plan_dispatch(state, queue, newest, cfg)
            state = d.apply_plan(state, plan, cfg)
            for r in plan.refreshes:  # loads take no time here
                state = d.complete_refresh(state, r.replica_id, r.to_version)
                acc.replicas.record(r.replica_id, r.to_version, t)
            for a in plan.assignments:
                for i in range(n):
                    acc.ledger.start(f"{a.group_id}_{i}", a.group_id, a.replica_id, a.version)
                    turns_left[f"{a.group_id}_{i}"] = rng.randint(1, 3)
            queue = list(plan.waiting)
            open_keys = sorted(k for k in turns_left if k.rsplit("_", 1)[0] in state.pins)
            for key in rng.sample(open_keys, min(len(open_keys), 3)):
                gid = key.rsplit("_", 1)[0]
                a = d.route(state, gid)  # one more turn of this response
                turns_left[key] -= 1
                if turns_left[key] == 0:
                    del turns_left[key]
                    acc.ledger.finish(TrajectoryRecord(key, gid, a.replica_id, a.version, 0.0, t, 4, 3, newest))
                    buf.put(Trajectory(key, gid, n, a.version))
                    if not any(k.rsplit("_", 1)[0] == gid for k in turns_left):
                        state, _ = d.finish_group(state, gid)
            if buf.stats().ready_groups >= 2:  # the trainer takes a step and publishes
                step += 1
                groups = buf.take(2, timeout=0)
                assert all(len(g.trajectories) == n for g in groups)
                acc.train_step(step, [tr.key for g in groups for tr in g.trajectories])
                newest = step
        # drain: finish everything in flight, then train the rest
        while queue or state.pins:
            state = d.apply_plan(state, plan := d.plan_dispatch(state, queue, None, cfg), cfg)
            queue = list(plan.waiting)
            for a in plan.assignments:
                for i in range(n):
                    acc.ledger.start(f"{a.group_id}_{i}", a.group_id, a.replica_id, a.version)
                    turns_left[f"{a.group_id}_{i}"] = 1
            for key in sorted(turns_left):
                gid = key.rsplit("_", 1)[0]
                if gid in state.pins:
                    a = d.route(state, gid)
                    acc.ledger.finish(TrajectoryRecord(key, gid, a.replica_id, a.version, 0.0, t, 4, 3, newest))
                    buf.put(Trajectory(key, gid, n, a.version))
                    del turns_left[key]
            for gid in sorted(state.pins):
                state, _ = d.finish_group(state, gid)
        ready = buf.stats().ready_groups
        if ready:
            acc.train_step(step + 1, [tr.key for g in buf.take(ready, timeout=0) for tr in g.trajectories])
        acc.ledger.check_nothing_lost()
        assert buf.missing() == {} and buf.stats().duplicates == 0
        assert acc.ledger.counts()["trained"] == submitted * n


def test_a_finished_trajectory_of_a_given_up_group_that_verl_trains_counts_as_trained():
    """A replica died while verl still held a group whose first response had finished: the router gave the
    group up, verl trained that response anyway. It is trained once, not discarded, and nothing is lost."""
    from verl_laminar.policy.accounting import Ledger, TrajectoryRecord

    ledger = Ledger()
    for i in range(2):
        ledger.start(f"g_{i}", "g", 1, 0)
    ledger.finish(TrajectoryRecord("g_0", "g", 1, 0, 0.0, 1.0, 10, 5, 0))
    for i in range(2):
        ledger.discard(f"g_{i}", "replica 1 died")
    assert ledger.counts()["discarded"] == 2
    assert [r.key for r in ledger.trained(["g_0"], 2)] == ["g_0"]
    assert ledger.counts() == {"in_flight": 0, "finished": 0, "trained": 1, "discarded": 1, "finished_tokens": 0}
    ledger.check_nothing_lost()
    import pytest

    from verl_laminar.policy.accounting import InvariantViolation

    with pytest.raises(InvariantViolation, match="again"):
        ledger.trained(["g_0"], 3)
    with pytest.raises(InvariantViolation, match="never finished"):
        ledger.trained(["g_1"], 3)
