"""The runtime's split (``policy.split``: closed-form estimate) against the planner's (``sim.search.best_split``:
the event simulation, hill-climbed) on the paper's workload: the same cost functions, so the two land within one
machine of each other. A run's start cannot afford the simulation; this says what the shortcut costs."""

from __future__ import annotations

import math

import pytest

from verl_laminar.policy.split import SplitRequest, Workload, min_trainer_gpus, plan_split
from verl_laminar.sim.costs import training_cost
from verl_laminar.sim.params import DEFAULT_PARAMS, MODELS, ROLLOUT_TP
from verl_laminar.sim.search import best_split


def _paper_workload(p) -> Workload:
    """The simulator's math task as means: log-normal lengths have mean median x exp(sigma^2 / 2)."""
    s, t = p.schedule, p.task("math")
    return Workload(sequences=s.prompts_per_step * s.group_size,
                    prompt_tokens=t.prompt_median * math.exp(t.prompt_sigma ** 2 / 2),
                    response_tokens=t.response_median * math.exp(t.response_sigma ** 2 / 2),
                    updates=s.minibatches, max_num_seqs=p.inference.max_num_seqs,
                    kv_memory_fraction=p.inference.kv_memory_fraction)


@pytest.mark.parametrize("model, gpus", [("7b", 64), ("32b", 128)])
def test_the_runtime_split_is_within_one_machine_of_the_planners(model, gpus):
    p = DEFAULT_PARAMS
    n, tp, shape = p.network.gpus_per_machine, ROLLOUT_TP[model], MODELS[model]
    planned = best_split("laminar", model, "math", gpus, 0, p).best.trainer_gpus
    floor = min_trainer_gpus(shape.params, p.device.hbm_bytes, training_cost(p))
    chosen = plan_split(SplitRequest(gpus // n, n, tp, floor), shape, p.device, tp, _paper_workload(p),
                        training_cost(p)).trainer_gpus
    assert abs(chosen - planned) <= n, (chosen, planned)
