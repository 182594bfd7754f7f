"""The GPU smoke run's CPU-checkable parts: its plan (refuses a single GPU, sets a bucket below the fixture's
largest tensor) and its verdict on a run's log. The verdict also judges the real CPU Laminar e2e run
(tests/trainer/test_laminar_e2e_on_cpu.py), so it is checked on a real log, not only on these lines."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from laminar_testing import REPO
from verl_laminar.report.runlog import RunRecord
from verl_laminar.smoke import evaluate, plan

LOG = "\n".join(["laminar: replica 0 loaded version 0", "laminar: replica 1 loaded version 0",
                 "laminar: replica 0 loaded version 1", "laminar: replica 1 loaded version 1",
                 "laminar: replica 1 loaded version 2", "laminar: replica 0 loaded version 2"])


def steps(last: int) -> RunRecord:
    """A run's step file read back: steps 1..last (the verdict reads no metric from the log)."""
    run = RunRecord("laminar")
    for s in range(1, last + 1):
        run.add_step(s, {"laminar/trajectories/trained": 32.0 * s, "timing_s/step": 1.0}, float(s))
    return run


def test_plan_needs_a_trainer_gpu_and_a_rollout_gpu(tmp_path):
    with pytest.raises(ValueError, match="needs 2 or more"):
        plan(1, 3, 16, tmp_path)
    cmd, env = plan(3, 3, 16, tmp_path)
    assert env["REPLICAS"] == "2" and env["STEPS"] == "3" and env["LAMINAR_CPU_PLATFORM"] == "0"
    assert "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=16" in cmd
    assert "laminar.run_until.events=[every_replica_refreshed]" in cmd  # STEPS is a cap, the refreshes end it


def test_bucket_is_below_the_fixtures_largest_tensor(tiny_model_dir, tmp_path):
    from verl_laminar.models.sizes import model_sizes

    _, largest = model_sizes(str(tiny_model_dir)).largest("bfloat16")
    cmd, _ = plan(2, 3, 16, tmp_path)
    bucket = float(next(a for a in cmd if "update_weights_bucket_megabytes" in a).split("=")[1]) * 1024**2
    assert bucket < largest  # so the oversized-tensor path runs at every refresh


def test_verdict_passes_a_good_run_and_names_each_failure():
    good = evaluate(LOG, steps=3, replicas=2, exit_code=0, shm_before={"old"}, shm_after={"old"}, run=steps(3))
    assert good["ok"], good
    assert good["replica_versions"] == {"0": [0, 1, 2], "1": [0, 1, 2]}
    stuck = evaluate(LOG.replace("replica 1 loaded version 1", "replica 1 loaded version 0").replace(
        "replica 1 loaded version 2", "replica 1 loaded version 0"), 3, 2, 0, set(), set(), steps(3))
    assert not stuck["checks"]["every_replica_loaded_trained_weights"]
    back = evaluate(LOG + "\nlaminar: replica 0 loaded version 1", 3, 2, 0, set(), set(), steps(3))
    assert not back["checks"]["versions_never_go_back"]
    leak = evaluate(LOG, 3, 2, 0, set(), {"relay0-1234abcd"}, steps(3))
    assert not leak["checks"]["dev_shm_empty_after"] and leak["left_in_dev_shm"] == ["relay0-1234abcd"]
    broken = evaluate(LOG + "\nInvariantViolation: mixed versions", 3, 2, 0, set(), set(), steps(3))
    assert not broken["checks"]["no_invariant_violation"]
    short = evaluate(LOG, 4, 2, 0, set(), set(), steps(3))
    assert not short["checks"]["every_step_trained"]
    assert not evaluate(LOG, 3, 3, 0, set(), set(), steps(3))["checks"]["every_replica_loaded_trained_weights"]


def test_verdict_takes_an_early_end_on_the_awaited_refreshes_and_only_that():
    two = LOG.split("laminar: replica 1 loaded version 2")[0]  # both replicas loaded version 1 by step 2
    ended = two + "laminar.run_until: every awaited event happened by step 2 (every_replica_refreshed at step 2); " \
                  "the run ends\n"
    early = evaluate(ended, steps=8, replicas=2, exit_code=0, shm_before=set(), shm_after=set(), run=steps(2))
    assert early["ok"] and (early["steps"], early["max_steps"]) == (2, 8), early
    # two steps of an 8-step cap without that line: the run stopped short, which is a failure
    assert not evaluate(two, 8, 2, 0, set(), set(), steps(2))["checks"]["every_step_trained"]


def test_dry_run_prints_the_plan_and_one_gpu_is_refused():
    proc = subprocess.run([sys.executable, "-m", "verl_laminar.smoke", "--gpus", "2", "--dry-run"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["env"]["REPLICAS"] == "1"
    proc = subprocess.run([sys.executable, "-m", "verl_laminar.smoke", "--gpus", "1"], capture_output=True,
                          text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 2 and "needs 2 or more" in proc.stderr
