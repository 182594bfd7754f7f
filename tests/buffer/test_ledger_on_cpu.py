"""The training ledger: leased groups are trained exactly once, across a trainer restart."""

import threading

import pytest

from verl_laminar.buffer.experience import Trajectory
from verl_laminar.buffer.ledger import TrainLedger
from verl_laminar.policy.accounting import InvariantViolation


def _fill(ledger, groups, n=2, version=0):
    for g in groups:
        ledger.put_group([Trajectory(f"{g}_{j}", g, n, version) for j in range(n)])


def test_lease_commit_and_stats():
    ledger = TrainLedger(clock=lambda: 5.0)
    _fill(ledger, ["a", "b", "c"])
    got = ledger.lease(2, timeout=1)
    assert [g.group_id for g in got] == ["a", "b"]
    rec = ledger.commit(1, ["a", "b"], tokens=40)
    assert (rec.step, rec.trajectories, rec.tokens, rec.committed_s) == (1, 4, 40, 5.0)
    assert ledger.trained() == {"a": 1, "b": 1}
    assert ledger.stats()["leased"] == 0 and ledger.stats()["ready"] == 1


def test_commit_twice_or_unleased_raises_and_counts():
    ledger = TrainLedger()
    _fill(ledger, ["a", "b"])
    ledger.lease(1, timeout=1)
    ledger.commit(1, ["a"], tokens=1)
    with pytest.raises(InvariantViolation, match="already trained"):
        ledger.commit(2, ["a"], tokens=1)
    assert ledger.duplicated == 1
    with pytest.raises(InvariantViolation, match="never leased"):
        ledger.commit(2, ["b"], tokens=1)


def test_restart_requeues_untrained_leases_first_and_accepts_checkpointed_ones():
    ledger = TrainLedger()
    _fill(ledger, ["a", "b", "c", "d"])
    ledger.lease(1, timeout=1)
    ledger.commit(1, ["a"], tokens=1)
    ledger.lease(2, timeout=1)  # b, c: the trainer checkpointed b's step (2) and died before committing
    out = ledger.recover({"a": 1, "b": 2})
    assert out == {"committed": 1, "requeued": 1}
    assert ledger.trained() == {"a": 1, "b": 2}
    # c goes back in front of d, and is leased by the restarted trainer
    assert [g.group_id for g in ledger.lease(2, timeout=1)] == ["c", "d"]
    ledger.commit(3, ["c", "d"], tokens=1)
    assert sorted(ledger.trained()) == ["a", "b", "c", "d"] and ledger.duplicated == 0


def test_restart_from_an_older_checkpoint_than_committed_is_refused():
    ledger = TrainLedger()
    _fill(ledger, ["a"])
    ledger.lease(1, timeout=1)
    ledger.commit(1, ["a"], tokens=1)
    with pytest.raises(InvariantViolation, match="older checkpoint"):
        ledger.recover({})


def test_lease_blocks_until_a_group_completes():
    ledger = TrainLedger()
    got = []
    t = threading.Thread(target=lambda: got.extend(ledger.lease(1, timeout=5)))
    t.start()
    _fill(ledger, ["late"])
    t.join(5)
    assert [g.group_id for g in got] == ["late"]
