"""``python -m verl_laminar.bench.learn --smoke``: the learning benchmark's plumbing, end to end on CPU.

One seed, verl's sync trainer and ``+laminar=enabled``, a budget of about a minute each, on the toy math set and
tiny-qwen on every machine (``_task_args`` says why). Checks on
the run's files, not its console: both modes' reward curves written, held-out accuracy evaluated from a
checkpoint saved during the run (its version recorded), equal prompt fingerprints over a common prefix, and the
result's shape; the command's own smoke verdict (exit 0) checks the same.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from laminar_testing import REPO
from verl_laminar.bench.learn import summary

# in CI: two launches of its own, 7-8 min on 2 cores (docs/testing.md says why it does not ride the sync launch)
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(2400)]


def _task_args(tiny_model_dir) -> list[str]:
    """The toy math set (val as dev and held-out) and tiny-qwen, whatever else this machine has built: the same
    inputs on every machine. With the chain task and tiny-chain (512-token responses) a 60 s budget held no sync
    step on a 2-core EPYC, so the smoke's outcome depended on which fixtures a machine's cache held."""
    return ["--data", str(REPO / "verl_laminar" / "data" / "toy_math"), "--model", str(tiny_model_dir)]


@pytest.fixture(scope="module")
def smoke(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("learn_smoke")
    cmd = [sys.executable, "-m", "verl_laminar.bench.learn", "--smoke", "--out", str(out), *_task_args(tiny_model_dir)]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=2300, env={**os.environ})
    (out / "stdout.log").write_text(proc.stdout)
    (out / "stderr.log").write_text(proc.stderr)
    res = json.loads((out / "result.json").read_text()) if (out / "result.json").is_file() else None
    return {"proc": proc, "out": out, "result": res, "wall_s": time.monotonic() - t0}


def test_smoke_exits_zero_with_a_result(smoke):
    assert smoke["proc"].returncode == 0, smoke["proc"].stderr[-4000:]
    assert smoke["result"] is not None
    assert summary.shape_problems(smoke["result"]) == []


def test_both_modes_wrote_reward_curves(smoke):
    modes = smoke["result"]["modes"]
    assert set(modes) == {"sync", "laminar"}
    for mode, m in modes.items():
        (run,) = m["seeds"]
        c = run["curve"]
        assert c["step"] and len(c["t_s"]) == len(c["reward"]) == len(c["step"]), mode
        assert all(0 < t <= smoke["result"]["clock"]["budget_s"] for t in c["t_s"]), mode
        assert c["t_s"] == sorted(c["t_s"]), mode
        assert run["ended_by"] in ("budget", "exit 0"), mode
    assert (smoke["out"] / "learn_reward.png").is_file() and (smoke["out"] / "learn_heldout.png").is_file()


def test_heldout_accuracy_comes_from_a_checkpoint_saved_in_the_run(smoke):
    for mode, m in smoke["result"]["modes"].items():
        (run,) = m["seeds"]
        late = [p for p in run["heldout"] if p["version"] > 0]
        assert late, f"{mode}: every mark read the warm start: {run['heldout']}"
        assert all(0.0 <= p["accuracy"] <= 1.0 and p["version"] <= max(run["curve"]["step"]) for p in late), mode
        assert (smoke["out"] / "seed0" / f"{mode}.heldout.json").is_file()


def test_every_mode_trained_the_same_prompts_in_the_same_order(smoke):
    order = smoke["result"]["prompt_order"]["seeds"]["0"]
    assert order["equal"] and order["common_prefix"] >= 1, order
    fps = {mode: m["prompt_fingerprint"]["0"] for mode, m in smoke["result"]["modes"].items()}
    assert len(set(fps.values())) == 1, fps
    for mode, m in smoke["result"]["modes"].items():
        p = m["seeds"][0]["prompts"]
        assert p["scored_groups"] >= p["covered_prefix"] >= order["common_prefix"], (mode, p)


def test_the_clock_and_the_staleness_are_recorded(smoke):
    modes = smoke["result"]["modes"]
    work = smoke["result"]["identity"]["workload"]
    per_step = work["batch"] * work["group"]
    for mode, m in modes.items():
        (run,) = m["seeds"]
        # one staleness definition for both modes (verl's lag at training), a count per trained trajectory
        assert sum(m["staleness_histogram"].values()) == run["steps"] * per_step, (mode, m["staleness_histogram"])
        assert run["first_dispatch_after_launch_s"] > 0 and run["checkpoint_saves_s"] > 0, mode
    assert modes["sync"]["staleness_histogram"] == {"0": modes["sync"]["seeds"][0]["steps"] * per_step}
    assert modes["laminar"]["laminar_staleness_n_minus_j"]
    # the clock's start against a measured dispatch: Laminar's first trajectory in its timeline
    check = modes["laminar"]["seeds"][0]["clock_check"]
    assert check and abs(check["difference_s"]) < 5.0, check
