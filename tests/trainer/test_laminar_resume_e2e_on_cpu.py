"""Trainer restart under `+laminar=enabled` with a detached fleet: verl's checkpoint resume, with the trainer
really killed, while the rollouts keep generating.

The two launches join a Ray cluster started first (``ray start --head``, as on a real cluster;
``fleet.cluster.local_cluster``) in a fixed namespace, with ``laminar.fleet.detached=true``: the replicas and the
partial-response pool are detached actors. Run 1 checkpoints every step and SIGKILLs the trainer's process (verl's
TaskRunner) right after step 2's checkpoint, once the replicas generate again: the job fails, and the replicas' requests in flight run to
their end into the pool. Run 2, the same command with ``trainer.resume_mode=auto``, resumes from step 2: it lets
the old replicas finish, counts the tokens that reached the pool after the dead trainer's last heartbeat, ends them,
builds its own, and verl re-issues the checkpoint's running prompts; the groups the pool holds whole are adopted
(``policy.adopt``) and trained, the rest generated again. Steps 3-5 train whole single-version groups, each once,
and nothing detached is left in the cluster after the clean end (docs/fleet_ownership.md)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from laminar_testing import run_cpu_laminar
from verl_laminar.fleet.cluster import local_cluster
from verl_laminar.report.runlog import RunRecord

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(2400)]  # two runs, ~10 min and ~10 GB on a 2-core host  # timeout: the run plus its checks

STEPS = 5  # the restored finished trajectories train first (step 3); the adopted ones by step 5
KILL_AFTER = 2
NAMESPACE = "laminar_resume_e2e"

LEFT_IN_CLUSTER = """
import json, ray
ray.init(namespace="%s")
named = ray.util.list_named_actors(all_namespaces=True)
pgs = [p for p in ray.util.placement_group_table().values() if p["state"] != "REMOVED"]
print(json.dumps({"named": named, "placement_groups": len(pgs)}))
""" % NAMESPACE


def _run(out, model, *overrides):
    return run_cpu_laminar(out, model, "trainer.save_freq=1", "trainer.resume_mode=auto",
                           "laminar.fleet.detached=true", f"+ray_kwargs.ray_init.namespace={NAMESPACE}", *overrides,
                           steps=STEPS, resp=64)


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("cpu_laminar_resume")
    saved = {k: os.environ.get(k) for k in ("RAY_ADDRESS", "RAY_AUTH_MODE", "LAMINAR_CPU_PLATFORM")}
    with local_cluster(gpus=3) as env:  # 1 trainer rank + 2 replicas, as logical GPUs
        os.environ.update(env)
        try:
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
            probe = subprocess.run([sys.executable, "-c", LEFT_IN_CLUSTER], capture_output=True, text=True,
                                   timeout=120)
        finally:
            for k, v in saved.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    assert rc2 == 0, log2[-6000:]
    assert probe.returncode == 0, probe.stderr[-3000:]
    return left, (rc1, log1), log2, json.loads(probe.stdout.strip().splitlines()[-1])


def test_the_killed_run_fails_after_its_checkpoint(runs):
    left, (rc1, log1), _, _ = runs
    assert rc1 != 0, log1[-3000:]
    assert re.search(rf"killing the trainer process \(SIGKILL of PID \d+\) after step {KILL_AFTER}", log1), log1[-3000:]
    assert left == {"tracker": str(KILL_AFTER), "steps": [f"global_step_{s}" for s in range(1, KILL_AFTER + 1)],
                    "actor": True}, left


def test_the_rerun_resumes_and_trains_the_rest_once_on_one_version(runs):
    _, _, log2, _ = runs
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


def test_the_rollouts_generated_while_the_trainer_was_down_and_that_work_was_trained(runs):
    _, _, log2, left_in_cluster = runs
    # both recorded replicas were still alive (none died and was replaced before the kill)
    assert re.search(r"laminar.fleet: ended the 2 live detached replicas a previous trainer left \(of 2 recorded",
                     log2), log2[-3000:]
    assert re.search(r"laminar.fleet: ended the 2 detached replicas at the run's end", log2), log2[-3000:]
    run = RunRecord("laminar").feed_all((0.0, line) for line in log2.splitlines())
    last = run.steps[STEPS]
    assert last["laminar/fleet/tokens_while_trainer_down"] > 0, last
    assert last["laminar/fleet/adopted_trajectories"] > 0, last
    assert last["laminar/fleet/adopted_trajectories_trained"] > 0, last
    # a clean end leaves nothing detached: no named actor, no placement group
    assert left_in_cluster == {"named": [], "placement_groups": 0}, left_in_cluster
