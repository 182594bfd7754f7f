"""Trainer restart under `+laminar=enabled`: verl's checkpoint resume, with the trainer really killed.

Run 1 checkpoints every step and SIGKILLs the trainer's process (verl's TaskRunner) right after step 2's
checkpoint and publication: the job fails. Run 2, the same command with ``trainer.resume_mode=auto``, resumes
from step 2: verl restores the weights, the dataloader and TransferQueue (finished trajectories kept, pending
and running prompts re-issued), Laminar's ledger adopts the restored trajectories, and step 3 trains whole
single-version groups, each once. The rollouts die with the TaskRunner (verl creates them there) and restart
with the job; see docs/fault_tolerance.md."""

from __future__ import annotations

import re

import pytest

from laminar_testing import run_cpu_laminar
from verl_laminar.report.runlog import RunRecord

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(2400)]  # two runs, ~8 min and ~10 GB on a 2-core host  # timeout: the run plus its checks

STEPS = 3
KILL_AFTER = 2


def _run(out, model, *overrides):
    return run_cpu_laminar(out, model, "trainer.save_freq=1", "trainer.resume_mode=auto", *overrides,
                           steps=STEPS, resp=64)


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("cpu_laminar_resume")
    rc1, log1 = _run(out, tiny_model_dir, f"laminar.fault_injection.kill_trainer_after_step={KILL_AFTER}")
    (out / "log1.txt").write_text(log1)
    ckpt = out / "checkpoints"
    tracker = ckpt / "latest_checkpointed_iteration.txt"
    # what the killed run left, before the rerun writes its own checkpoint
    left = {"tracker": tracker.read_text().strip() if tracker.exists() else None,
            "steps": sorted(p.name for p in ckpt.glob("global_step_*")),
            "actor": (ckpt / f"global_step_{KILL_AFTER}" / "actor").is_dir()}
    rc2, log2 = _run(out, tiny_model_dir)
    (out / "log2.txt").write_text(log2)
    assert rc2 == 0, log2[-6000:]
    return left, (rc1, log1), log2


def test_the_killed_run_fails_after_its_checkpoint(runs):
    left, (rc1, log1), _ = runs
    assert rc1 != 0, log1[-3000:]
    assert re.search(rf"killing the trainer process \(SIGKILL of PID \d+\) after step {KILL_AFTER}", log1), log1[-3000:]
    assert left == {"tracker": str(KILL_AFTER), "steps": [f"global_step_{s}" for s in range(1, KILL_AFTER + 1)],
                    "actor": True}, left


def test_the_rerun_resumes_and_trains_the_rest_once_on_one_version(runs):
    _, _, log2 = runs
    assert re.search(rf"Resuming from .*global_step_{KILL_AFTER}", log2), log2[-3000:]
    adopted = re.search(rf"laminar: resumed at step {KILL_AFTER}; (\d+) finished trajectories", log2)
    assert adopted, log2[-3000:]
    run = RunRecord("laminar").feed_all((0.0, line) for line in log2.splitlines())
    assert sorted(run.steps) == list(range(KILL_AFTER + 1, STEPS + 1))
    assert "InvariantViolation" not in log2
    last = run.steps[STEPS]
    assert last["laminar/trajectories/trained"] == (STEPS - KILL_AFTER) * 8 * 4  # this process's steps
    for step, m in run.steps.items():
        assert m["training/off_policy/trajectory_spans/max"] == 1, step
