"""LaminarReplayBuffer on fake TransferQueue metadata (verl's kv_list layout): complete groups only, first
completed first out, one version per trajectory and per group checked on every sample, failures refilled."""

from __future__ import annotations

import pytest

from verl_laminar.buffer.replay import LaminarReplayBuffer, trajectories_of_group
from verl_laminar.policy.accounting import InvariantViolation


class FakeTQ:
    """kv_list() -> {partition: {key: tag}}; prompts carry is_prompt/status/global_steps."""

    def __init__(self) -> None:
        self.data: dict[str, dict[str, dict]] = {"train": {}}
        self.cleared: list[str] = []

    def prompt(self, uid: str, status: str, step: int = 1) -> None:
        self.data["train"][uid] = {"is_prompt": True, "status": status, "global_steps": step}

    def outputs(self, uid: str, versions: list[tuple[int, int]]) -> None:
        for s, (lo, hi) in enumerate(versions):
            self.data["train"][f"{uid}_{s}_0"] = {"status": "success", "min_global_steps": lo,
                                                  "max_global_steps": hi, "global_steps": 1}

    def kv_list(self):
        return {p: dict(items) for p, items in self.data.items()}

    def kv_clear(self, keys, partition_id):
        for k in keys:
            self.data[partition_id].pop(k, None)
            self.cleared.append(k)


@pytest.fixture
def fake_tq(monkeypatch):
    import verl.trainer.ppo.v1.replay_buffer as rb

    tq = FakeTQ()
    monkeypatch.setattr(rb, "tq", tq)
    return tq


def make_buffer(refills: list[int]) -> LaminarReplayBuffer:
    return LaminarReplayBuffer(trainer_mode="laminar", trainer_config={}, max_off_policy_threshold=None,
                               max_off_policy_strategy="drop", sampler_kwargs={}, poll_interval=0.01,
                               refill_fn=refills.append, rollout_n=2)


def test_samples_complete_groups_in_completion_order(fake_tq):
    buf = make_buffer([])
    fake_tq.prompt("b", "finished")
    fake_tq.outputs("b", [(3, 3), (3, 3)])
    fake_tq.prompt("a", "running")
    fake_tq.outputs("a", [(2, 2)])
    buf._sync_metadata_from_transfer_queue()
    buf._feed("train")
    fake_tq.prompt("a", "finished")
    fake_tq.outputs("a", [(2, 2), (2, 2)])
    batch, metrics = buf.sample(global_steps=5, partition_id="train", batch_size=2)
    # b completed first although a was submitted first; verl's order would be by submission step
    assert sorted(batch.keys) == ["a_0_0", "a_1_0", "b_0_0", "b_1_0"]
    assert {"a", "b"} <= set(fake_tq.cleared)
    assert buf.checked_trajectories == 4 and metrics == {}


def test_mixed_version_trajectory_or_group_raises(fake_tq):
    buf = make_buffer([])
    fake_tq.prompt("m", "finished")
    fake_tq.outputs("m", [(1, 2), (1, 1)])  # session 0 spans versions 1 and 2
    with pytest.raises(InvariantViolation, match="mixes weight versions"):
        buf.sample(global_steps=3, partition_id="train", batch_size=1)
    buf = make_buffer([])
    fake_tq.data["train"].clear()
    fake_tq.prompt("g", "finished")
    fake_tq.outputs("g", [(1, 1), (2, 2)])  # each trajectory pure, the group is not
    with pytest.raises(InvariantViolation, match="group 'g' mixes versions"):
        buf.sample(global_steps=3, partition_id="train", batch_size=1)


def test_failed_groups_are_cleared_and_refilled(fake_tq):
    refills: list[int] = []
    buf = make_buffer(refills)
    fake_tq.prompt("f", "failure")
    fake_tq.outputs("f", [(1, 1)])
    fake_tq.prompt("ok", "finished")
    fake_tq.outputs("ok", [(1, 1), (1, 1)])
    batch, _ = buf.sample(global_steps=2, partition_id="train", batch_size=1)
    assert refills == [1] and sorted(batch.keys) == ["ok_0_0", "ok_1_0"]
    assert "f_0_0" in fake_tq.cleared
    assert buf.experience.stats().discarded_groups == 1


def test_group_size_is_checked_against_rollout_n():
    part = {"u_0_0": {"min_global_steps": 1, "max_global_steps": 1}}
    with pytest.raises(InvariantViolation, match="expected rollout.n=2"):
        trajectories_of_group("u", part, rollout_n=2)
    assert [t.key for t in trajectories_of_group("u", part)] == ["u_0"]


def test_resumed_checkpoint_finished_groups_enter_the_ledger_and_train_once():
    """verl's resume restores TransferQueue: finished groups stay, running ones are re-issued by verl. The
    restored finished trajectories enter the ledger (this process's router never saw them start)."""
    from verl_laminar.buffer.replay import restored_records
    from verl_laminar.policy.accounting import Ledger

    tq = FakeTQ()
    tq.prompt("a", "finished")
    tq.outputs("a", [(1, 1), (1, 1)])
    tq.prompt("b", "running")  # re-issued by verl, not adopted
    tq.outputs("b", [(2, 2)])
    tq.data["train"]["a_0_0"].update(prompt_len=7, response_len=11)
    recs = restored_records(tq.kv_list()["train"], rollout_n=2, n_now=2, t=5.0)
    assert [(r.key, r.group_id, r.version, r.trainer_version_at_finish) for r in recs] == [
        ("a_0", "a", 1, 2), ("a_1", "a", 1, 2)]
    assert (recs[0].prompt_tokens, recs[0].response_tokens, recs[0].staleness) == (7, 11, 1)
    ledger = Ledger()
    for r in recs:
        ledger.finish(r)
    assert [r.key for r in ledger.trained(["a_0", "a_1"], step=3)] == ["a_0", "a_1"]
    with pytest.raises(InvariantViolation, match="trained at step 3 and again"):
        ledger.trained(["a_0"], step=4)
    tq.outputs("c", [(1, 1), (1, 2)])  # a mixed-version trajectory in a restored group still raises
    tq.prompt("c", "finished")
    with pytest.raises(InvariantViolation):
        restored_records(tq.kv_list()["train"], rollout_n=2, n_now=2, t=5.0)


def test_a_wait_for_samples_raises_once_the_rollouts_stopped(fake_tq):
    """The router stopped (a failed refresh): nothing more is generated, so the trainer's wait must end with that
    cause instead of polling forever; the check is asked at most every HEALTH_EVERY_S, not on every poll."""
    import verl_laminar.buffer.replay as replay

    asked = []
    stopped = []

    def health():
        asked.append(1)
        if stopped:
            raise RuntimeError("the rollout router stopped: LoadTimeout('replica 0 ...')")

    buf = LaminarReplayBuffer(trainer_mode="laminar", trainer_config={}, max_off_policy_threshold=None,
                              max_off_policy_strategy="drop", sampler_kwargs={}, poll_interval=0.01,
                              refill_fn=[].append, rollout_n=2, health=health)
    fake_tq.prompt("a", "running")
    for _ in range(5):
        buf._sync_metadata_from_transfer_queue()
    assert len(asked) == 1  # throttled
    stopped.append(1)
    buf._health_at -= replay.HEALTH_EVERY_S
    with pytest.raises(RuntimeError, match="router stopped"):
        buf.sample(global_steps=1, partition_id="train", batch_size=2)  # no group will ever finish


def test_a_planner_chooses_the_batch_and_hears_of_failed_groups(fake_tq):
    """laminar.buffer.max_staleness: the planner (the router's plan_batch) picks which complete groups a step
    trains; it is asked only with a whole batch ready, waits by answering None, and learns of failed groups."""
    calls: list = []
    answers = [None, ["old"]]

    def planner(step, ready, dropped, size):
        assert size == 1  # the batch size verl asks for
        calls.append((step, sorted(ready), list(dropped)))
        return answers.pop(0)

    buf = LaminarReplayBuffer(trainer_mode="laminar", trainer_config={}, max_off_policy_threshold=None,
                              max_off_policy_strategy="drop", sampler_kwargs={}, poll_interval=0.01,
                              refill_fn=lambda n: None, rollout_n=2, planner=planner)
    fake_tq.prompt("f", "failure")
    fake_tq.outputs("f", [(1, 1)])
    fake_tq.prompt("new", "finished")
    fake_tq.outputs("new", [(4, 4), (4, 4)])
    fake_tq.prompt("old", "finished")
    fake_tq.outputs("old", [(2, 2), (2, 2)])
    batch, _ = buf.sample(global_steps=5, partition_id="train", batch_size=1)
    assert sorted(batch.keys) == ["old_0_0", "old_1_0"]
    assert calls[0] == (5, [("new", 4), ("old", 2)], ["f"])  # the failed group is told once
    assert calls[1] == (5, [("new", 4), ("old", 2)], [])
    assert buf.experience.ready() == [("new", 4)]  # left for a later step
