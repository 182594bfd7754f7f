"""Experience buffer: only complete groups leave, FIFO of completion, one version per group, dup/lost counts."""

import random
import threading
import time

import pytest

from verl_laminar.buffer.experience import (
    BufferClosed,
    BufferTimeout,
    ExperienceBuffer,
    PutResult,
    Trajectory,
)
from verl_laminar.policy.accounting import InvariantViolation


def tr(group, i, n=2, version=0):
    return Trajectory(f"{group}_{i}", group, n, version)


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        self.t += 1.0
        return self.t


def test_only_complete_groups_in_order_of_completion():
    buf = ExperienceBuffer(clock=Clock())
    results = [buf.put(t) for t in (tr("a", 0), tr("b", 0), tr("b", 1), tr("c", 0, n=1), tr("a", 1))]
    assert results == [PutResult.ACCEPTED, PutResult.ACCEPTED, PutResult.COMPLETED_GROUP,
                       PutResult.COMPLETED_GROUP, PutResult.COMPLETED_GROUP]
    groups = buf.take(3, timeout=0)
    assert [g.group_id for g in groups] == ["b", "c", "a"]  # completion order, not first arrival
    assert [t.key for t in groups[2].trajectories] == ["a_0", "a_1"]
    assert groups[0].completed_s < groups[1].completed_s < groups[2].completed_s


def test_partial_group_is_never_released():
    buf = ExperienceBuffer()
    buf.put(tr("a", 0, n=3))
    buf.put(tr("a", 1, n=3))
    with pytest.raises(BufferTimeout, match="0 of 1 groups ready.*1 groups incomplete"):
        buf.take(1, timeout=0.01)
    s = buf.stats()
    assert (s.ready_groups, s.partial_groups, s.accepted) == (0, 1, 2)


@pytest.mark.parametrize(
    "second,error,match",
    [
        (tr("a", 1, version=1), InvariantViolation, "mixes versions 0 .* and 1"),
        (tr("a", 1, n=3), ValueError, "says its group has 3 responses"),
    ],
)
def test_group_consistency_raises(second, error, match):
    buf = ExperienceBuffer()
    buf.put(tr("a", 0))
    with pytest.raises(error, match=match):
        buf.put(second)


def test_duplicates_and_late_arrivals_are_dropped_and_counted():
    buf = ExperienceBuffer()
    buf.put(tr("a", 0))
    assert buf.put(tr("a", 0)) is PutResult.DUPLICATE
    buf.put(tr("b", 0))
    assert buf.discard_group("b", "sibling failed") == 1
    assert buf.put(tr("b", 1)) is PutResult.DISCARDED_GROUP
    assert buf.put(tr("b", 1)) is PutResult.DUPLICATE
    s = buf.stats()
    assert (s.duplicates, s.late_for_discarded, s.discarded_groups, s.partial_groups) == (2, 1, 1, 1)


def test_a_trained_group_cannot_grow_or_be_discarded():
    buf = ExperienceBuffer()
    buf.put(tr("a", 0, n=1))
    buf.take(1, timeout=0)
    with pytest.raises(InvariantViolation, match="already complete and trained"):
        buf.put(tr("a", 1, n=1))
    with pytest.raises(InvariantViolation, match="already trained"):
        buf.discard_group("a", "late failure")


def test_discard_removes_a_ready_group():
    buf = ExperienceBuffer()
    buf.put(tr("a", 0, n=1))
    assert buf.discard_group("a", "filtered") == 1
    assert buf.stats().ready_groups == 0


def test_missing_reports_lost_trajectories():
    buf = ExperienceBuffer()
    for g in "abcd":
        buf.expect(g, 2)
    buf.put(tr("a", 0))
    buf.put(tr("b", 0))
    buf.put(tr("b", 1))
    buf.discard_group("c", "failed")
    assert buf.missing() == {"a": 1, "d": 2}
    buf.take(1, timeout=0)
    assert buf.missing() == {"a": 1, "d": 2}


def test_take_blocks_until_a_producer_completes_groups():
    buf = ExperienceBuffer()

    def produce():
        for g in range(3):
            time.sleep(0.01)
            buf.put(tr(f"g{g}", 0, n=1))

    th = threading.Thread(target=produce)
    th.start()
    groups = buf.take(3, timeout=5)
    th.join()
    assert [g.group_id for g in groups] == ["g0", "g1", "g2"]
    assert buf.stats().wait_s_total > 0


def test_close_wakes_a_waiting_trainer():
    buf = ExperienceBuffer()
    threading.Timer(0.02, buf.close).start()
    with pytest.raises(BufferClosed, match="closed while waiting"):
        buf.take(1, timeout=5)


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="n_groups=0"):
        ExperienceBuffer().take(0)
    with pytest.raises(ValueError, match="group_size=0"):
        Trajectory("k", "g", 0, 1)


def test_concurrent_random_delivery_loses_and_duplicates_nothing():
    """Property: 4 producers deliver shuffled responses (some twice); the trainer gets every group once."""
    rng = random.Random(2)
    groups = {f"g{i}": (rng.randint(1, 4), rng.randint(0, 3)) for i in range(200)}
    items = [tr(g, i, n, v) for g, (n, v) in groups.items() for i in range(n)]
    items += rng.sample(items, 50)  # re-deliveries
    rng.shuffle(items)
    buf = ExperienceBuffer()
    for g, (n, _) in groups.items():
        buf.expect(g, n)
    chunks = [items[k::4] for k in range(4)]
    threads = [threading.Thread(target=lambda c=c: [buf.put(t) for t in c]) for c in chunks]
    for th in threads:
        th.start()
    taken = []
    while len(taken) < len(groups):
        taken += buf.take(1, timeout=5)
    for th in threads:
        th.join()
    assert sorted(g.group_id for g in taken) == sorted(groups)
    for g in taken:
        n, v = groups[g.group_id]
        assert len(g.trajectories) == n and {t.version for t in g.trajectories} == {v}
        assert len({t.key for t in g.trajectories}) == n
    s = buf.stats()
    assert s.duplicates == 50 and buf.missing() == {} and s.partial_groups == 0


def test_take_ids_takes_the_chosen_groups_and_leaves_the_rest_in_order():
    buf = ExperienceBuffer()
    for g, v in (("a", 3), ("b", 1), ("c", 2)):
        buf.put(tr(g, 0, n=1, version=v))
    assert buf.ready() == [("a", 3), ("b", 1), ("c", 2)]
    assert [g.group_id for g in buf.take_ids(["b", "c"])] == ["b", "c"]
    assert buf.ready() == [("a", 3)] and buf.stats().taken_groups == 2
    with pytest.raises(InvariantViolation, match="not ready"):
        buf.take_ids(["b"])  # already taken
    with pytest.raises(InvariantViolation, match="repeated"):
        buf.take_ids(["a", "a"])
    with pytest.raises(InvariantViolation, match="trained"):
        buf.put(tr("b", 1, n=1, version=1))  # a taken group cannot grow
