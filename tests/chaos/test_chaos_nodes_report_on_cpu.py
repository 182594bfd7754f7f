"""``chaos --nodes``: the report's arithmetic on synthetic logs (``chaos.node_report``), and the plan's checks."""

from __future__ import annotations

import pytest

from verl_laminar.chaos import node_report as nr
from verl_laminar.chaos.nodes import plan_for


def _ev(t: float, msg: str) -> tuple[float, str]:
    return t, msg


def test_generation_recovery_is_the_first_window_wholly_after_the_kill_at_90_percent():
    # 10 tokens/s before the kill at t=100; nothing for 40 s; then 10 tokens/s again from t=140
    traj = [(float(t), 10) for t in range(40, 100)] + [(float(t), 10) for t in range(140, 240)]
    before, rec = nr.generation_recovered(traj, 100.0, window_s=30.0)
    assert before == pytest.approx(290 / 30)  # (70, 100]: 29 trajectories
    # the window (t-30, t] holds >= 0.9 x 290 tokens (27 trajectories from t=140 on) first at t=166
    assert rec == pytest.approx(66.0)
    assert nr.generation_recovered(traj[:60], 100.0, window_s=30.0)[1] is None  # never back


def test_a_machine_kill_reads_its_replicas_deaths_replacements_and_first_tokens():
    ev = [_ev(10, "laminar: replica 0 runs on node 198.18.0.2 (abc)"),
          _ev(10, "laminar: replica 1 runs on node 198.18.0.3 (def)"),
          _ev(10, "laminar: replica 2 runs on node 198.18.0.3 (def)"),
          _ev(100, "laminar.chaos: killed node w2 (198.18.0.3): machine loss"),
          _ev(102, "replica 1 died (connection lost): 1 open groups moved"),
          _ev(104.5, "replica 2 died (connection lost): 0 open groups moved"),
          _ev(180, "laminar: replica 4 replaces replica 1: started in 70.0 s"),
          _ev(181, "laminar: replica 4 runs on node 198.18.0.4 (ghi)"),
          _ev(190, "laminar: replica 5 replaces replica 2: started in 80.0 s"),
          _ev(191, "laminar: replica 5 runs on node 198.18.0.4 (ghi)"),
          _ev(200, "laminar: replica 4 streams: its first token within 0.1 s of its requests")]
    k = nr.machine_kill(ev, 100.0, "198.18.0.3", "198.18.0.4", [], [], 300.0)
    assert k["replicas"] == [1, 2] and k["detect_s"] == 4.5
    assert k["replacements"] == {"1": 4, "2": 5} and k["replacement_on_joined_node"]
    assert k["first_replacement_token_s"] == 100.0
    other = nr.machine_kill(ev, 100.0, "198.18.0.3", "198.18.0.9", [], [], 300.0)
    assert not other["replacement_on_joined_node"]  # replaced, but not on the machine that joined


def test_a_partition_names_the_replicas_on_the_cut_machine_and_when_they_were_declared_dead():
    ev = [_ev(10, "laminar: replica 0 runs on node 198.18.0.2 (abc)"),
          _ev(50, "laminar.chaos: partitioned node w1 (198.18.0.2): link down"),
          _ev(54, "replica 0 died (unreachable): 2 open groups moved")]
    p = nr.partition(ev, 50.0, 65.0, "198.18.0.2", 100.0)
    assert p["replicas"] == [0] and p["detect_s"] == 4.0 and p["healed_s"] == 15.0


def test_training_rate_needs_two_steps():
    assert nr.training_rate([(1.0, 100.0)], 0, 10) is None
    assert nr.training_rate([(1.0, 100.0), (3.0, 100.0), (5.0, 300.0)], 0, 10) == 100.0


def test_the_plan_puts_the_partition_after_the_kill_and_refuses_too_few_steps():
    p = plan_for(0, 40, partition=True)
    assert p.kill_step == 5 and p.partition_step is not None and p.kill_step < p.partition_step < 40
    assert plan_for(1, 40, partition=False).partition_step is None
    with pytest.raises(ValueError, match="--steps"):
        plan_for(0, 12, partition=True)


def test_the_harness_log_reads_back_as_stamped_events(tmp_path):
    from verl_laminar.chaos.nodes import HarnessLog
    from verl_laminar.chaos.report import stamped

    log = HarnessLog(tmp_path / "h.log")
    t = log.event("killed node w2 (198.18.0.3): machine loss")
    (got_t, msg), = stamped((tmp_path / "h.log").read_text())
    assert abs(got_t - t) < 0.002 and nr.KILLED.search(msg)


@pytest.mark.parametrize("step, killed, parted, replaced, want", [
    (4, False, False, False, None),         # before the kill step
    (5, False, False, False, "kill"),       # at it
    (7, False, False, False, "kill"),       # late (the loop looked after a step it missed): still once
    (8, True, False, False, None),          # killed; no partition before its step
    (9, True, False, False, None),          # at its step, but no replacement joined yet
    (9, True, False, True, "partition"),    # a replacement joined
    (12, True, True, True, None),           # each fault once
])
def test_the_harness_strikes_each_machine_fault_once_in_order(step, killed, parted, replaced, want):
    from verl_laminar.chaos.nodes import due

    assert due(plan_for(0, 40, partition=True), step, killed, parted, replaced) == want


def test_without_a_partition_only_the_kill_is_due():
    from verl_laminar.chaos.nodes import due

    plan = plan_for(0, 40, partition=False)
    assert due(plan, 30, True, False, True) is None and due(plan, 5, False, False, False) == "kill"
