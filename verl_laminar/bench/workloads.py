"""The end-to-end benchmark's named CPU workloads, and what their response lengths look like.

A workload is everything the recipe's ``WORKLOAD`` block takes from the benchmark: prompts per step, group size,
the response cap, the micro-batch and which seeded length distribution (an entry of
``recipes/cpu/skewed_agent_loop.yaml``) fixes each trajectory's length. Every mode of one run gets the same
workload, so the same prompts produce the same tokens.

* ``paper``: the regime the paper describes, where generation dominates a synchronous step (its DAPO step: up to
  83 %) because one step waits for its longest trajectory and lengths are long-tailed (p99 ~10x the median).
* ``short``: the benchmark's first workload (short tail, many trajectories per step), where the trainer's
  update is most of a sync step; kept to show how the gain depends on the generation share.

Pure: no processes, importable without ray/torch/vllm/verl.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from verl_laminar.policy.lengths import SkewedLengths

REPO = Path(__file__).resolve().parents[2]
LENGTHS_YAML = REPO / "recipes" / "cpu" / "skewed_agent_loop.yaml"


@dataclass(frozen=True)
class Workload:
    name: str
    batch: int  # prompts per step (data.train_batch_size = ppo_mini_batch_size: one update per step)
    group: int  # responses per prompt (GRPO group, rollout.n)
    resp: int  # max response tokens: the length distribution's cap
    micro: int  # micro-batch per rank (larger: less per-call overhead; each holds micro x length x vocab fp32
    #   logits: on the Qwen-vocabulary fixture 4 x 1,900 ran the colocated sync run out of 24 GiB)
    loop: str  # agent loop (recipes/cpu/skewed_agent_loop.yaml entry) that fixes each response's length
    about: str
    fixture: str = "tiny-qwen"  # the model every mode trains and serves (verl_laminar.fixtures.FIXTURES)
    steps: int = 8  # training steps per mode: enough that the measured window (steps 2..N) spans several refreshes

    def env(self) -> dict[str, str]:
        """What the CPU recipes (recipes/cpu/common.sh) read."""
        return {"BATCH": str(self.batch), "GROUP": str(self.group), "RESP": str(self.resp),
                "MICRO": str(self.micro), "SKEW": "1", "SKEW_LOOP": self.loop}


WORKLOADS: dict[str, Workload] = {
    # The paper regime needs the trainer's cost per token small beside a decode step's, as a 7B update is beside
    # its long-tail decode on GPUs. On the Qwen-vocabulary fixture the 151,680-way logits made the update most of
    # a step whatever the lengths (generation share 0.71 at best); the small-vocabulary fixture is the same model
    # shape with a 640-token vocabulary, so the update shrinks ~10x and generation is ~80 % of a sync step.
    # Steps are then seconds, so 24 of them: the measured window spans many weight refreshes.
    "paper": Workload("paper", batch=2, group=4, resp=1900, micro=4, loop="laminar_skewed_paper",
                      about="generation-dominated: a long tail (median 192, p99 ~1900 tokens) over 8 trajectories "
                            "a step, on the small-vocabulary fixture", fixture="tiny-bpe", steps=24),
    "short": Workload("short", batch=8, group=4, resp=256, micro=8, loop="laminar_skewed",
                      about="update-dominated: a short tail over many trajectories (median 24, p99 240)"),
}
DEFAULT = "paper"


def workload(name: str, **overrides: Optional[int]) -> Workload:
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    base = asdict(WORKLOADS[name])
    base.update({k: v for k, v in overrides.items() if v is not None})
    for key in ("batch", "group", "resp", "micro", "steps"):
        if int(base[key]) < 1:
            raise ValueError(f"--{key} {base[key]}: must be >= 1")
    return Workload(**base)


def loop_parameters(loop: str, path: Path = LENGTHS_YAML) -> dict:
    """The length distribution's parameters, read from the agent-loop registry the recipes pass to verl."""
    import yaml

    entries = yaml.safe_load(path.read_text()) or []
    for entry in entries:
        if entry.get("name") == loop:
            return {k: entry[k] for k in ("median", "p99_ratio", "min_tokens", "seed") if k in entry}
    raise ValueError(f"agent loop {loop!r} is not in {path.name}; its entries: {[e.get('name') for e in entries]}")


def length_profile(w: Workload, path: Path = LENGTHS_YAML) -> dict:
    """Percentiles of the response lengths the workload asks for (the distribution, capped at ``resp``), and of
    the max over one step's trajectories, which a synchronous step waits for."""
    params = loop_parameters(w.loop, path)
    lengths = SkewedLengths(max_tokens=w.resp, **params)
    # 2000 prompts x the group: the keys (prompt index, response index) a run draws from
    raw = [lengths.length(i, s) for i in range(2000) for s in range(w.group)]
    draws, n = sorted(raw), len(raw)

    def pct(q: float) -> int:
        return draws[min(n - 1, int(q * n))]

    per_step = w.batch * w.group
    step_max = sorted(max(raw[k:k + per_step]) for k in range(0, n - per_step + 1, per_step))
    return {"loop": w.loop, **params, "cap": w.resp, "p50": pct(0.50), "p90": pct(0.90), "p99": pct(0.99),
            "p99_over_p50": round(pct(0.99) / pct(0.50), 2), "mean": round(sum(draws) / n, 1),
            "step_max_p50": step_max[len(step_max) // 2], "trajectories_per_step": per_step}
