"""Fault-tolerance boundary for reward functions: a score function that raises, hangs or crashes is scored as
a failure with a logged reason, and the run goes on.

Use it from verl 0.9.1 by pointing the custom reward function at it and naming the real function:

    reward.custom_reward_function.path=pkg://verl_laminar.reward.robust
    reward.custom_reward_function.name=compute_score
    +reward.custom_reward_function.reward_kwargs.score_fn=verl.utils.reward_score:default_compute_score
    +reward.custom_reward_function.reward_kwargs.timeout_s=10

It composes with `reward.reward_manager.name=dapo` (the overlong penalty is added on top by the manager).
A malformed row (no ground truth, no data_source) raises MalformedRowError naming the row by default: that is
a data bug to fix, not a flaky reward; `on_malformed=fail` scores such rows as failures instead.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import threading
from dataclasses import dataclass
from typing import Any

from verl_laminar.reward import fn_spec
from verl_laminar.reward.outcome import DEFAULT_TEMPLATE, failure_result, success_result, template_of
from verl_laminar.reward.pool import ScorePool
from verl_laminar.reward.rows import MalformedRowError, check_row, row_label

logger = logging.getLogger(__name__)


class RewardConfigError(ValueError):
    pass


@dataclass(frozen=True)
class RobustRewardConfig:
    # The real score function, 'module:function' or 'file.py:function'.
    score_fn: str = fn_spec.DEFAULT_SCORE_FN
    # Seconds one row may take; the worker is killed and replaced after that.
    timeout_s: float = 10.0
    # Score of a failed row; -1.0 is math_dapo's score for a wrong answer, so failures are never rewarded.
    failure_score: float = -1.0
    # Worker processes per reward worker; rows beyond that wait.
    num_procs: int = 2
    # "raise": a malformed row stops the run naming the row; "fail": it is scored as a failure and logged.
    on_malformed: str = "raise"
    # Seconds a worker may take to import the score function (verl's own scorers import torch).
    load_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        for key in ("timeout_s", "num_procs", "load_timeout_s"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise RewardConfigError(f"reward_kwargs.{key}={value!r} is invalid: set a positive number")
        if self.on_malformed not in ("raise", "fail"):
            raise RewardConfigError(f"reward_kwargs.on_malformed={self.on_malformed!r}: use 'raise' or 'fail'")
        fn_spec.parse_spec(self.score_fn)


class RobustScorer:
    def __init__(self, config: RobustRewardConfig) -> None:
        self.config = config
        self.pool = ScorePool(fn_spec.parse_spec(config.score_fn), int(config.num_procs), config.load_timeout_s)
        self._executor = concurrent.futures.ThreadPoolExecutor(int(config.num_procs), thread_name_prefix="reward")
        self._template: dict[str, Any] = dict(DEFAULT_TEMPLATE)
        self.failures = 0

    def _fail(self, reason: str) -> dict[str, Any]:
        self.failures += 1
        logger.warning("reward failed (scored %s): %s", self.config.failure_score, reason)
        return failure_result(self._template, self.config.failure_score, reason)

    def score(self, *, data_source: Any, solution_str: Any, ground_truth: Any, extra_info: Any = None, **kwargs: Any) -> dict:
        label = row_label(data_source, extra_info)
        try:
            check_row(data_source, solution_str, ground_truth, extra_info)
        except MalformedRowError as e:
            if self.config.on_malformed == "raise":
                raise
            return self._fail(str(e))
        call = dict(data_source=data_source, solution_str=solution_str, ground_truth=ground_truth, extra_info=extra_info)
        call.update(kwargs)
        outcome = self.pool.call(call, self.config.timeout_s)
        if not outcome.ok:
            # A timeout is either a hung scorer or a slow one: say which setting lets a slow one finish.
            hint = " (if the score function is only slow, raise reward_kwargs.timeout_s)" if outcome.timed_out else ""
            return self._fail(f"{label}: {outcome.reason}{hint}")
        try:
            result = success_result(outcome.value)
        except (TypeError, ValueError) as e:
            return self._fail(f"{label}: {e}")
        self._template = template_of(result)
        return result

    async def ascore(self, **kwargs: Any) -> dict:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(self.score, **kwargs))

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self.pool.close()


_SCORERS: dict[RobustRewardConfig, RobustScorer] = {}
_SCORERS_LOCK = threading.Lock()


def get_scorer(config: RobustRewardConfig) -> RobustScorer:
    """One scorer (and worker pool) per distinct config per process."""
    with _SCORERS_LOCK:
        scorer = _SCORERS.get(config)
        if scorer is None:
            scorer = _SCORERS[config] = RobustScorer(config)
        return scorer


_CONFIG_KEYS = {"score_fn", "timeout_s", "failure_score", "num_procs", "on_malformed", "load_timeout_s"}


async def compute_score(data_source: Any, solution_str: Any, ground_truth: Any, extra_info: Any = None, **kwargs: Any) -> dict:
    """verl custom reward function entry; our settings arrive through `reward_kwargs`, the rest passes through."""
    settings = {k: kwargs.pop(k) for k in list(kwargs) if k in _CONFIG_KEYS}
    scorer = await asyncio.get_running_loop().run_in_executor(None, get_scorer, RobustRewardConfig(**settings))
    return await scorer.ascore(
        data_source=data_source, solution_str=solution_str, ground_truth=ground_truth, extra_info=extra_info, **kwargs
    )
