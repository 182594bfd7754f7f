"""verl's own sync GRPO trainer (main_ppo), end to end on CPU through our plugin: the foundation's proof.

Runs the CPU recipe for 2 steps with greedy validation before training and after each step, and an HF
checkpoint at the end, then checks on the artifacts (not on log text alone) that:
* the policy weights changed (saved step-2 HF weights vs the fixture's);
* the rollout serves the updated weights: greedy validation outputs change after an update, and verl's
  rollout-vs-actor log-prob correlation stays high at step 2 (when weights are not synced it collapses);
* verl's usual per-step metrics are written to verl's file tracker (the console tracker is off).
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from laminar_testing import REPO
from verl_laminar.report import tracker_file
from verl_laminar.report.runlog import parse_step_line

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]  # timeout: the run plus its checks


def _metrics_by_step(run: dict) -> dict[int, dict[str, float]]:
    """The steps verl's file tracker wrote (the benchmarks' source too): the console tracker is off in this run."""
    return tracker_file.read_steps(run["out"] / tracker_file.FILE_NAME)


@pytest.fixture(scope="module")
def sync_run(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("cpu_sync")
    env = {**os.environ, "STEPS": "2", "RESP": "64", "OUT": str(out), "MODEL": str(tiny_model_dir)}
    cmd = [
        "bash", str(REPO / "recipes/cpu/run_sync_grpo.sh"),
        "trainer.val_before_train=True", "trainer.test_freq=1",
        f"trainer.validation_data_dir={out}/val",
        "trainer.save_freq=2",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model]",
        # A larger step than the demo's, so that two updates visibly move greedy outputs of a tiny model.
        "actor_rollout_ref.actor.optim.lr=2e-3",
        "trainer.logger=[file]",  # no console tracker: every metric the checks read comes from the file
    ]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1500, cwd=REPO)
    (out / "stdout.log").write_text(proc.stdout)
    (out / "stderr.log").write_text(proc.stderr)
    return {"proc": proc, "out": out, "wall_s": time.monotonic() - t0, "log": proc.stdout + proc.stderr}


def test_recipe_exits_zero_with_per_step_metrics(sync_run):
    assert sync_run["proc"].returncode == 0, sync_run["log"][-4000:]
    assert not [ln for ln in sync_run["log"].splitlines() if parse_step_line(ln)], "console tracker off, yet a step line"
    steps = _metrics_by_step(sync_run)
    assert {1, 2} <= set(steps), sorted(steps)
    for s in (1, 2):
        for key in ("actor/pg_loss", "actor/grad_norm", "critic/score/mean", "response_length/mean",
                    "timing_s/step", "timing_s/gen"):
            assert key in steps[s], (s, key, sorted(steps[s])[:50])
    assert steps[1]["actor/grad_norm"] > 0  # rewards differ within groups, so the policy gradient is non-zero


def test_policy_weights_changed(sync_run, tiny_model_dir):
    import torch
    from safetensors.torch import load_file

    hf_dir = sync_run["out"] / "checkpoints" / "global_step_2" / "actor" / "huggingface"
    files = sorted(hf_dir.glob("*.safetensors"))
    assert files, f"no HF weights saved under {hf_dir}"
    after = {k: v for f in files for k, v in load_file(str(f)).items()}
    before = load_file(str(tiny_model_dir / "model.safetensors"))
    common = sorted(set(before) & set(after))
    assert len(common) >= len(before) - 1  # lm_head may be tied
    changed = [k for k in common if not torch.allclose(before[k].float(), after[k].float(), atol=1e-6)]
    assert len(changed) >= len(common) // 2, f"only {len(changed)}/{len(common)} tensors changed"


def test_rollout_serves_the_updated_weights(sync_run):
    val = sync_run["out"] / "val"

    def outputs(step: int) -> list[str]:
        rows = [json.loads(line) for line in (val / f"{step}.jsonl").read_text().splitlines()]
        return [r["output"] for r in rows]

    step0, step2 = outputs(0), outputs(2)
    assert len(step0) == len(step2) == 64
    assert sum(a != b for a, b in zip(step0, step2)) >= 1, "greedy outputs identical after two updates"
    corr = _metrics_by_step(sync_run)[2].get("training/rollout_actor_probs_pearson_corr")
    assert corr is not None and corr > 0.9, corr
