"""The reward fault-tolerance boundary: raising, hanging, crashing and misbehaving score functions."""

import logging
import textwrap
import time

import pytest

from verl_laminar.reward.fn_spec import ScoreFnSpecError, parse_spec
from verl_laminar.reward.pool import WorkerLoadError
from verl_laminar.reward.robust import RewardConfigError, RobustRewardConfig, RobustScorer
from verl_laminar.reward.rows import MalformedRowError

SCORERS = textwrap.dedent(
    """
    import os, time

    def good(data_source, solution_str, ground_truth, extra_info=None):
        ok = solution_str.strip().endswith(str(ground_truth))
        return {"score": 1.0 if ok else -1.0, "acc": ok, "pred": solution_str[-3:], "length": len(solution_str)}

    def boom(**kwargs):
        raise ValueError("catastrophic regex")

    def hang(**kwargs):
        while True:
            time.sleep(1)

    def crash(**kwargs):
        os._exit(7)

    def wrong_type(**kwargs):
        return "1.0"

    def nan_score(**kwargs):
        return {"score": float("nan"), "acc": False, "pred": ""}

    def inf_score(**kwargs):
        return float("-inf")

    def only_two(solution_str, ground_truth):
        return 1.0 if solution_str == ground_truth else -1.0

    async def async_good(solution_str, ground_truth, **kwargs):
        return {"score": 1.0, "acc": True, "pred": "", "length": 0}

    STATE = {"calls": 0}

    def flaky(**kwargs):
        STATE["calls"] += 1
        if STATE["calls"] % 2 == 0:
            raise RuntimeError("every second call fails")
        return {"score": 1.0, "acc": True, "pred": "x", "length": 3}
    """
)

ROW = dict(data_source="math_dapo", solution_str="so it is 34", ground_truth="34", extra_info={"index": 11, "split": "train"})


@pytest.fixture(scope="module")
def scorer_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("scorers") / "scorers.py"
    path.write_text(SCORERS)
    return path


@pytest.fixture
def make(scorer_file):
    made = []

    def build(name, **overrides):
        config = RobustRewardConfig(score_fn=f"{scorer_file}:{name}", num_procs=1, **overrides)
        scorer = RobustScorer(config)
        made.append(scorer)
        return scorer

    yield build
    for scorer in made:
        scorer.close()


def test_success_is_passed_through(make):
    result = make("good").score(**ROW)
    assert result == {"score": 1.0, "acc": True, "pred": " 34", "length": 11, "reward_failed": False, "reward_error": ""}


def test_raise_is_a_logged_failure_naming_the_row(make, caplog):
    scorer = make("boom")
    with caplog.at_level(logging.WARNING, logger="verl_laminar.reward.robust"):
        result = scorer.score(**ROW)
    assert result["reward_failed"] and result["score"] == -1.0 and result["acc"] is False
    assert "ValueError: catastrophic regex" in result["reward_error"]
    assert "index=11" in result["reward_error"]
    assert "catastrophic regex" in caplog.text


@pytest.mark.parametrize("name, reason", [("hang", "timed out after 1.0s"), ("crash", "exit code 7"), ("wrong_type", "expected a number")])
def test_hang_crash_and_bad_return_are_failures_and_the_worker_recovers(make, name, reason):
    scorer = make(name, timeout_s=1.0)
    start = time.monotonic()
    first = scorer.score(**ROW)
    assert time.monotonic() - start < 1.0 + 5
    assert first["reward_failed"] and reason in first["reward_error"]
    second = scorer.score(**ROW)  # the replaced worker answers the next row
    assert second["reward_failed"] and reason in second["reward_error"]
    assert scorer.failures == 2


@pytest.mark.parametrize("name, value", [("nan_score", "nan"), ("inf_score", "-inf")])
def test_a_non_finite_score_is_a_failure_naming_the_row(make, name, value):
    result = make(name).score(**ROW)
    assert result["reward_failed"] and result["score"] == -1.0, result
    assert f"non-finite score ({value})" in result["reward_error"] and "index=11" in result["reward_error"]


def test_failures_carry_the_same_keys_as_successes(make):
    scorer = make("flaky")
    ok = scorer.score(**ROW)
    failed = scorer.score(**ROW)
    assert not ok["reward_failed"] and failed["reward_failed"]
    assert set(ok) == set(failed)
    assert failed["length"] == 0 and failed["pred"] == "[REWARD_FAILED]"


def test_kwargs_are_fitted_to_the_function_and_async_functions_work(make):
    assert make("only_two").score(**{**ROW, "solution_str": "34"})["score"] == 1.0
    assert make("async_good").score(**ROW)["score"] == 1.0


def test_malformed_rows_raise_naming_the_row_or_fail_when_asked(make):
    scorer = make("good")
    with pytest.raises(MalformedRowError, match=r"index=11.*ground_truth is missing"):
        scorer.score(**{**ROW, "ground_truth": None})
    with pytest.raises(MalformedRowError, match="data_source"):
        scorer.score(**{**ROW, "data_source": ""})
    lenient = make("good", on_malformed="fail")
    result = lenient.score(**{**ROW, "ground_truth": ""})
    assert result["reward_failed"] and "index=11" in result["reward_error"]


def test_configuration_errors_stop_at_start_up(scorer_file):
    with pytest.raises(WorkerLoadError, match="no function 'missing'"):
        RobustScorer(RobustRewardConfig(score_fn=f"{scorer_file}:missing", num_procs=1))
    with pytest.raises(ScoreFnSpecError, match="module:function"):
        RobustRewardConfig(score_fn="no_colon_here")
    with pytest.raises(RewardConfigError, match="timeout_s=0"):
        RobustRewardConfig(timeout_s=0)
    with pytest.raises(RewardConfigError, match="on_malformed"):
        RobustRewardConfig(on_malformed="ignore")


@pytest.mark.parametrize(
    "spec, module, is_file",
    [
        ("verl.utils.reward_score:default_compute_score", "verl.utils.reward_score", False),
        ("pkg://verl_laminar/reward/tool_answer:compute_score", "verl_laminar.reward.tool_answer", False),
        ("/abs/reward.py:score", "/abs/reward.py", True),
    ],
)
def test_parse_spec(spec, module, is_file):
    parsed = parse_spec(spec)
    assert (parsed.module, parsed.is_file) == (module, is_file)
    assert parsed.preload_module == (None if is_file else module)
