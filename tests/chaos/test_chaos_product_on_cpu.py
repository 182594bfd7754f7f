"""The product chaos run (``chaos.product``, ``chaos.report``): its seeded plan, the command it launches, and the
report read from launch logs (synthetic logs in the exact line formats the trainer, router and verl print)."""

from __future__ import annotations

from datetime import datetime

import pytest

from verl_laminar.chaos import product
from verl_laminar.chaos.report import build_report, effective_ratio, rate, stamped
from verl_laminar.policy.faults import Fault, parse_schedule
from verl_laminar.report.runlog import RunRecord

T0 = datetime(2026, 12, 3, 10, 0, 0).timestamp()


def _line(t: float, level: str, msg: str, who: str = "TaskRunnerV1 pid=1") -> str:
    stamp = datetime.fromtimestamp(T0 + t).strftime("%Y-%m-%d %H:%M:%S") + f",{int(round((t % 1) * 1000)):03d}"
    return f"\x1b[36m({who})\x1b[0m {level}:{stamp}:{msg}"


def _step(step: int, tokens: float, spans: int = 1, down: int = 0, adopted: int = 0) -> tuple[int, dict]:
    """One step as verl's file tracker gives it (the launcher reads it from there, never from the console)."""
    return step, {"perf/total_num_tokens": tokens, "training/off_policy/trajectory_spans/max": spans,
                  "laminar/ft/groups_moved": step // 3, "laminar/fleet/tokens_while_trainer_down": down,
                  "laminar/fleet/adopted_trajectories_trained": adopted}


def test_the_plan_is_seeded_spaced_and_complete():
    counts = product.parse_counts(product.DEFAULT_FAULTS)
    assert sum(counts.values()) == 11 and counts["replica_kill"] == 3 and counts["trainer_kill"] == 2
    a, b = product.plan_faults(counts, 0, 8), product.plan_faults(counts, 1, 8)
    assert [f.step for f in a] == [3 + 8 * i for i in range(11)]
    assert sorted(f.kind for f in a) == sorted(f.kind for f in b) and a != b  # same faults, another order
    assert product.plan_faults(counts, 0, 8) == a
    with pytest.raises(ValueError, match="KIND=N"):
        product.parse_counts("replica_kill=3,relay=1")


def test_the_launch_passes_the_plan_as_the_trainers_schedule_and_resumes(tmp_path):
    plan = [Fault(3, "replica_kill"), Fault(11, "trainer_kill")]
    cmd, env = product.launch_command(tmp_path, "/m", plan, 19, ["laminar.pool.flush_tokens=8"])
    sched = next(a for a in cmd if a.startswith("laminar.fault_injection.schedule="))
    assert parse_schedule(sched.split("=", 1)[1].strip("'")) == tuple(plan)
    assert "trainer.save_freq=1" in cmd and "trainer.resume_mode=auto" in cmd
    assert env["STEPS"] == "19" and cmd[-1] == "laminar.pool.flush_tokens=8"
    assert product.parse_args(["--fleet"]).fleet and not product.parse_args([]).fleet


def test_the_report_reads_faults_recoveries_and_throughput_from_the_logs(tmp_path):
    log0 = [_line(1, "INFO", "laminar: every replica loaded version 0: {0: 0, 1: 0}")]
    steps0 = [_step(s, 1000.0) for s in range(1, 8)]
    log0 += [_line(30, "WARNING", "laminar.fault_injection: killed replica 1 (SIGKILL of PIDs [11, 12])"),
             _line(30.4, "ERROR", "replica 1 died (ActorDiedError()): 4 open groups moved", "LaminarRouter pid=2"),
             _line(50, "WARNING", "request r of group 'g': its replica died; running it again on the group's new "
                                  "replica (version 3)", "LaminarAgentLoopWorker pid=3"),
             _line(110, "WARNING", "laminar: replica 2 replaces replica 1: started in 80.0 s; it loads ...")]
    log0 += [_line(160, "WARNING", "laminar.fault_injection: killing the trainer process (SIGKILL of PID 1) after "
                                   "step 7")]
    log1 = [_line(250, "INFO", "laminar: every replica loaded version 7: {0: 7, 1: 7}"),
            _line(262, "INFO", "laminar step 8: staleness [0], replica versions {0: 7, 1: 7}, 32 trajectories")]
    # the next launch found 70 tokens generated after the killed trainer's last beat; it trained 4 adopted responses
    steps1 = [_step(s, 1000.0, spans=2 if s == 9 else 1, down=70, adopted=4) for s in range(8, 11)]
    launches = []
    for i, (lines, steps, t0, seen) in enumerate([
            (log0, steps0, T0, {1: 10, 2: 20, 3: 29, 4: 120, 5: 130, 6: 140, 7: 150}),
            (log1, steps1, T0 + 200, {8: 62, 9: 72, 10: 82})]):
        path = tmp_path / f"launch{i}.log"
        path.write_text("\n".join(lines) + "\n")
        rec = RunRecord(f"launch{i}")
        for step, metrics in steps:
            rec.add_step(step, metrics, float(seen[step]))
        rec.exit_code = 0 if i else -9
        launches.append({"t0": t0, "record": rec, "log": path})
    plan = [Fault(3, "replica_kill"), Fault(7, "trainer_kill")]
    r = build_report(plan, 10, launches, T0, T0 + 290)
    assert r["faults_injected"] == 2 and r["completed"] and r["trained_steps"] == 10
    kill, trainer = r["faults"]
    assert (kill["kind"], kill["replica"], kill["replacement"]) == ("replica_kill", 1, 2)
    assert kill["detected_s"] == pytest.approx(0.4) and kill["recovery_s"] == pytest.approx(80.0)
    assert trainer["recovery_s"] == pytest.approx(102.0) and trainer["rollouts_serving_s"] == pytest.approx(90.0)
    assert r["rerun_from_prompt"] == 1 and r["duplicated"] == 0 and r["mixed_version_steps"] == 1
    assert r["moved_groups"] == 2 + 3  # each launch's last step, summed (a new trainer process counts afresh)
    # before the kill: steps 1-3, the tokens of steps 2-3 over the 19 s from step 1 to step 3; after the
    # replacement joined: steps 4-7, the tokens of steps 5-7 over 30 s
    assert kill["tokens_per_s_before"] == pytest.approx(2000.0 / 19.0)
    assert kill["tokens_per_s_after"] == pytest.approx(3000.0 / 30.0)
    # kept progress: from step 1 to step 7 of launch 0 (140 s) and from step 8 to step 10 of launch 1 (20 s), of 290 s
    assert r["effective_training_time_ratio"] == pytest.approx((150 - 10 + 82 - 62) / 290, abs=1e-3)
    assert r["tokens_generated_while_trainer_down"] == 70 and r["adopted_trajectories_trained"] == 4


def test_stamped_lines_and_rates_need_enough_steps_of_one_launch():
    assert stamped(_line(1.5, "INFO", "x"))[0] == (pytest.approx(T0 + 1.5), "x")
    steps = [(T0 + 10, 1, 100.0, 0), (T0 + 20, 2, 100.0, 0), (T0 + 30, 3, 100.0, 1)]
    assert rate(steps, T0, T0 + 40) is None  # two launches: the restart is not a step
    assert rate(steps[:2], T0, T0 + 40) is None  # too few
    assert effective_ratio(steps, T0, T0 + 40) == pytest.approx(10 / 40)
