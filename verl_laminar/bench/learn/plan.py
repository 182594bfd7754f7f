"""What the learning benchmark runs (pure: no processes): the modes, each mode's recipe command, the plumbing it
adds to a plain recipe run, the wall-clock marks, which checkpoint a mark reads, and the targets' rule.

Every mode runs its CPU recipe (``recipes/cpu/run_*.sh``) with the same workload environment (prompts per step,
group size, caps, learning rate) and the same benchmark plumbing (``plumbing_overrides``: the seed, a checkpoint
per step holding only the HF model, the reward recorder). The Laminar modes add nothing else: ``laminar`` is what a
user gets from ``+laminar=enabled`` on that recipe, ``laminar_bounded`` that plus ``laminar.buffer.max_staleness=2``
(a test composes both and diffs them against the plain recipe's config).
"""

from __future__ import annotations

import bisect
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional, Sequence

REPO = Path(__file__).resolve().parents[3]
RECIPES = REPO / "recipes" / "cpu"
RECORDER = REPO / "verl_laminar" / "reward" / "recorded.py"
RECORD_ENV = "LAMINAR_REWARD_RECORD"  # verl_laminar.reward.recorded.ENV (not imported: bench is a leaf)
MODES = ("sync", "separate_async", "laminar", "laminar_bounded")
SMOKE_MODES = ("sync", "laminar")
# verl's trainers sample finished trajectories polling every 2 s by default; bench.e2e's baselines poll every
# 0.1 s like Laminar's sampler (bench.sampler says why), and so do they here.
FAST_POLL = {"sync": "FastPollReplayBuffer", "separate_async": "FastPollReplayBufferAsync"}
MODE_SETTINGS = {"laminar_bounded": ("laminar.buffer.max_staleness=2",)}  # on top of the product's defaults
# Steps a run may take: never reached, the wall-clock budget ends every run (the launcher ends its process tree).
STEPS_CAP = 100000
# The config keys (leaves of the composed config) in which a mode's run may differ from the same recipe run
# plainly with the same workload environment. tests/bench/test_learn_on_cpu.py composes both and checks this.
PLUMBING_KEYS = (
    "data.train_files",  # the task's files, staged under the run's folder (train; dev as verl's val file)
    "data.val_files",
    "data.seed",  # the part's seed: the prompt order
    "actor_rollout_ref.rollout.seed",  # the part's seed: vLLM's sampling
    "trainer.default_local_dir",  # the run's folder
    "trainer.save_freq",  # a checkpoint per step (off the clock; pruned to the marks' versions)
    "actor_rollout_ref.actor.checkpoint.save_contents",  # only the HF model (held-out evaluation reads it)
    "reward.custom_reward_function.path",  # verl's default reward, unchanged, that notes each prompt's index
    "ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH",  # verl's file tracker, in the run's folder
    f"ray_kwargs.ray_init.runtime_env.env_vars.{RECORD_ENV}",  # where the recorder writes
)


@dataclass(frozen=True)
class Workload:
    """What the CPU recipes read from the environment (recipes/cpu/common.sh), the same in every mode."""

    batch: int = 8  # prompts per step (data.train_batch_size = ppo_mini_batch_size)
    group: int = 4  # responses per prompt (rollout.n)
    resp: int = 512  # max response tokens
    prompt: int = 256  # max prompt tokens (longer prompts are filtered out by verl, in every mode alike)
    lr: float = 1e-4  # actor learning rate (the recipes' default)
    micro: int = 4  # micro-batch per rank for the log-prob and update passes (8 exhausted 24 GiB in sync
    # mode on a CPU without fast bf16: fp32 logits of 8 x 768 tokens x 151,680 rows, ~6.5 GB a rank)

    def env(self) -> dict[str, str]:
        return {"BATCH": str(self.batch), "GROUP": str(self.group), "RESP": str(self.resp),
                "PROMPT": str(self.prompt), "LR": repr(self.lr), "MICRO": str(self.micro), "STEPS": str(STEPS_CAP),
                "TASK": "math", "SKEW": "0"}

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Placement:
    """Where a mode runs on the host: logical Ray GPUs over the host's shared cores."""

    trainer_ranks: int
    rollout_replicas: int
    colocated: bool

    @property
    def logical_gpus(self) -> int:
        return self.trainer_ranks if self.colocated else self.trainer_ranks + self.rollout_replicas

    def as_dict(self, cores: Optional[int] = None) -> dict:
        return {"cores": cores if cores is not None else os.cpu_count(), "logical_gpus": self.logical_gpus,
                "trainer_ranks": self.trainer_ranks, "rollout_replicas": self.rollout_replicas,
                "colocated": self.colocated,
                "about": ("trainer ranks are the rollout replicas (colocated), all on the host's shared cores"
                          if self.colocated else "trainer ranks beside standalone rollout replicas, all on the "
                                                 "host's shared cores")}


def placement(mode: str, sync_ranks: int = 2, trainer_ranks: int = 1, replicas: int = 2) -> Placement:
    check_mode(mode)
    if mode == "sync":
        return Placement(sync_ranks, sync_ranks, True)
    return Placement(trainer_ranks, replicas, False)


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
    return mode


@dataclass(frozen=True)
class RunPaths:
    """One run's files: the recipe's OUT folder, the staged data, the reward record, verl's file tracker."""

    out: Path
    data: Path

    @property
    def record(self) -> Path:
        return self.out / "reward_record.jsonl"

    @property
    def tracker(self) -> Path:
        return self.out / "verl_metrics.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.out / "checkpoints"

    def checkpoint(self, version: int) -> Path:
        """The HF model verl saved after step ``version`` (= weights version ``version``)."""
        return self.checkpoints / f"global_step_{version}" / "actor" / "huggingface"


def plumbing_overrides(seed: int, paths: RunPaths) -> list[str]:
    """The Hydra overrides every mode appends to its recipe (each key is in PLUMBING_KEYS)."""
    return [f"data.seed={seed}", f"actor_rollout_ref.rollout.seed={seed}",
            "trainer.save_freq=1", "actor_rollout_ref.actor.checkpoint.save_contents=[hf_model]",
            f"reward.custom_reward_function.path={RECORDER}", "reward.custom_reward_function.name=compute_score",
            f"+ray_kwargs.ray_init.runtime_env.env_vars.{RECORD_ENV}={paths.record}"]


def sampler_overrides(mode: str) -> list[str]:
    if mode not in FAST_POLL:
        return []
    return ["trainer.v1.sampler.custom_sampler.path=pkg://verl_laminar.bench.sampler",
            f"trainer.v1.sampler.custom_sampler.name={FAST_POLL[mode]}"]


def mode_overrides(mode: str) -> list[str]:
    """What a mode sets beyond its recipe and the plumbing (recorded in the result)."""
    return [*sampler_overrides(mode), *MODE_SETTINGS.get(mode, ())]


def mode_command(mode: str, workload: Workload, paths: RunPaths, model: str, seed: int, python: str,
                 place: Optional[Placement] = None) -> tuple[list[str], dict[str, str]]:
    """The recipe command and its environment for one run of ``mode``."""
    place = place or placement(mode)
    env = {**workload.env(), "DATA": str(paths.data), "MODEL": str(model), "OUT": str(paths.out), "PY": python,
           "VERL_FILE_LOGGER_PATH": str(paths.tracker), RECORD_ENV: str(paths.record), "PYTHONUNBUFFERED": "1"}
    extra = [*plumbing_overrides(seed, paths), *mode_overrides(mode)]
    if mode == "sync":
        env["N_RANKS"] = str(place.trainer_ranks)
        return ["bash", str(RECIPES / "run_sync_grpo.sh"), *extra], env
    env["REPLICAS"], env["TRAINER_RANKS"] = str(place.rollout_replicas), str(place.trainer_ranks)
    recipe = "run_separate_async_grpo.sh" if mode == "separate_async" else "run_laminar_grpo.sh"
    return ["bash", str(RECIPES / recipe), *extra], env


# -- wall-clock marks and the checkpoints they read ------------------------------------------------------------


def marks(budget_s: float, n: int) -> list[float]:
    """``n`` evenly spaced marks ending at the budget: budget/n, 2 budget/n, ..., budget."""
    if n < 1 or budget_s <= 0:
        raise ValueError(f"need marks >= 1 and a positive budget, got marks={n}, budget={budget_s}")
    return [round(budget_s * j / n, 3) for j in range(1, n + 1)]


def version_at(mark_s: float, published: Sequence[tuple[float, int]]) -> int:
    """The weights at a mark: the last version published at or before it (``published``: (clock s, version),
    in publication order); 0, the warm start, before the first."""
    times = [t for t, _ in published]
    i = bisect.bisect_right(times, mark_s)
    return published[i - 1][1] if i else 0


def versions_at_marks(mark_list: Sequence[float], published: Sequence[tuple[float, int]]) -> dict[float, int]:
    return {m: version_at(m, published) for m in mark_list}


def keep_while_running(mark_list: Sequence[float], published: Sequence[tuple[float, int]]) -> set[int]:
    """The checkpoints a run still needs, given what it published so far: the version at every mark already
    passed (final) and the newest version (it may be the one at the next marks). Every other can be deleted."""
    if not published:
        return set()
    newest_t, newest = published[-1]
    keep = {version_at(m, published) for m in mark_list if m < newest_t}
    keep.add(newest)
    keep.discard(0)
    return keep


def keep_after_run(mark_list: Sequence[float], published: Sequence[tuple[float, int]]) -> set[int]:
    """The checkpoints the held-out evaluation reads once the run is over (``published`` within the budget)."""
    return {v for v in versions_at_marks(mark_list, published).values() if v != 0}


# -- targets ------------------------------------------------------------------------------------------------------


TARGET_RULE = ("fixed before the runs from the warm-started model (weights version 0): reward target = its mean "
               "reward on the dev prompts, sampled as training samples (rollout temperature, {group} responses a "
               "prompt, the same response cap, verl's math_dapo score in [-1, 1]) + {reward_margin}; held-out "
               "target = its greedy accuracy on the held-out prompts + {heldout_margin} (each capped at the "
               "score's maximum). A run reaches the reward target at the first step whose mean training reward "
               "over its last {window} steps (the same number of trajectories in every mode) is at or above it; "
               "the held-out target at the first mark whose evaluated accuracy is at or above it.")


@dataclass(frozen=True)
class Targets:
    reward: float
    heldout: float
    base_dev_reward: float
    base_heldout_accuracy: float
    reward_margin: float
    heldout_margin: float
    reward_window_steps: int
    rule: str

    def as_dict(self) -> dict:
        return asdict(self)


def fix_targets(base_dev_reward: float, base_heldout_accuracy: float, reward_margin: float, heldout_margin: float,
                window: int, group: int) -> Targets:
    rule = TARGET_RULE.format(group=group, reward_margin=reward_margin, heldout_margin=heldout_margin, window=window)
    return Targets(reward=round(min(1.0, base_dev_reward + reward_margin), 4),
                   heldout=round(min(1.0, base_heldout_accuracy + heldout_margin), 4),
                   base_dev_reward=round(base_dev_reward, 4), base_heldout_accuracy=round(base_heldout_accuracy, 4),
                   reward_margin=reward_margin, heldout_margin=heldout_margin, reward_window_steps=window, rule=rule)


def targets_from_dict(d: dict) -> Targets:
    return Targets(**{k: d[k] for k in Targets.__dataclass_fields__})
