"""Trainer restart under `+laminar=enabled` with a detached fleet: verl's checkpoint resume, with the trainer
really killed, while the rollouts keep generating (the runs: ``restart_run``).

Run 1 is killed after step 2's checkpoint; run 2, the same command with ``trainer.resume_mode=auto``, resumes from
step 2: it lets the old replicas finish, counts the tokens that reached the pool after the dead trainer's last
heartbeat, ends them, builds its own, and verl re-issues the checkpoint's running prompts; the groups the pool holds
whole are adopted (``policy.adopt``) and trained, the rest generated again. The later steps train whole
single-version groups, each once (run 2 also loses a replica and the pool on the way: the failover e2e reads that),
and nothing detached is left in the cluster after the clean end (docs/fleet_ownership.md)."""

from __future__ import annotations

import re

import pytest

from restart_run import KILL_AFTER, RUN2_EVENTS

# two runs, ~15 min and ~10 GB on a 2-core host, shared with the failover e2e  # timeout: the runs plus their checks
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3000)]


def test_the_killed_run_fails_after_its_checkpoint(restart_runs):
    runs = restart_runs
    assert runs.rc1 != 0, runs.log1[-3000:]
    assert re.search(rf"killing the trainer process \(SIGKILL of PID \d+\) after step {KILL_AFTER}", runs.log1), \
        runs.log1[-3000:]
    assert runs.left == {"tracker": str(KILL_AFTER),
                         "steps": [f"global_step_{s}" for s in range(1, KILL_AFTER + 1)], "actor": True}, runs.left


def test_the_rerun_resumes_and_trains_the_rest_once_on_one_version(restart_runs):
    log2 = restart_runs.log2
    assert re.search(rf"Resuming from .*global_step_{KILL_AFTER}", log2), log2[-3000:]
    adopted = re.search(rf"laminar: resumed at step {KILL_AFTER}; (\d+) finished trajectories", log2)
    assert adopted, log2[-3000:]
    run = restart_runs.run2()
    end = restart_runs.last_step  # the step after which its awaited events had happened (laminar.run_until)
    assert sorted(run.steps) == list(range(KILL_AFTER + 1, end + 1))
    assert "InvariantViolation" not in log2
    last = run.steps[end]
    assert last["laminar/trajectories/trained"] == (end - KILL_AFTER) * 8 * 4  # this process's steps
    for step, m in run.steps.items():
        assert m["training/off_policy/trajectory_spans/max"] == 1, step
    # training moves the policy: a step whose groups all scored alike has zero advantages and a zero gradient, but
    # not every step of the math task can (the tool task's e2e run may score alike throughout)
    assert any(m["actor/grad_norm"] > 0 for m in run.steps.values()), [m["actor/grad_norm"] for m in run.steps.values()]


def test_the_rollouts_generated_while_the_trainer_was_down_and_that_work_was_trained(restart_runs):
    log2 = restart_runs.log2
    # both recorded replicas were still alive (none died and was replaced before the kill)
    assert re.search(r"laminar.fleet: ended the 2 live detached replicas a previous trainer left \(of 2 recorded",
                     log2), log2[-3000:]
    # the live ones at the end: replica 0 and the replacement of the replica killed on the way
    assert re.search(r"laminar.fleet: ended the 2 detached replicas at the run's end", log2), log2[-3000:]
    run = restart_runs.run2()
    last = run.steps[restart_runs.last_step]
    assert last["laminar/fleet/tokens_while_trainer_down"] > 0, last
    assert last["laminar/fleet/adopted_trajectories"] > 0, last
    assert last["laminar/fleet/adopted_trajectories_trained"] > 0, last
    # the run ended on that event (and the replacement's), not on a step count
    assert "adopted_trained" in RUN2_EVENTS and "adopted_trained at step" in log2, log2[-3000:]
    # a clean end leaves nothing detached: no named actor, no placement group
    assert restart_runs.left_in_cluster == {"named": [], "placement_groups": 0}, restart_runs.left_in_cluster
