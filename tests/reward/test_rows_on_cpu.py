"""Pure reward helpers: row checks and result shaping."""

import numpy as np
import pytest

from verl_laminar.reward.outcome import DEFAULT_TEMPLATE, failure_result, success_result, template_of
from verl_laminar.reward.rows import MalformedRowError, check_dataset_rows, check_row

GOOD = dict(data_source="math_dapo", solution_str="Answer: 3", ground_truth="3", extra_info={"index": 4})


@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"data_source": None}, "data_source must be"),
        ({"solution_str": b"bytes"}, "response must be a string"),
        ({"ground_truth": None}, "ground_truth is missing"),
        ({"ground_truth": "  "}, "ground_truth is missing"),
        ({"ground_truth": object()}, "unsupported type"),
        ({"extra_info": "index=4"}, "extra_info must be a mapping"),
    ],
)
def test_check_row_names_the_row_and_the_problem(change, fragment):
    with pytest.raises(MalformedRowError, match=fragment) as info:
        check_row(**{**GOOD, **change})
    assert "data_source" in str(info.value)
    if "extra_info" not in change:
        assert "index=4" in str(info.value)


@pytest.mark.parametrize("ground_truth", ["3", 3, 3.5, ["3", "three"], np.array(["3"])])
def test_check_row_accepts(ground_truth):
    assert check_row(**{**GOOD, "ground_truth": ground_truth}) is None  # raises for a bad row


def test_check_dataset_rows_names_the_position():
    rows = [
        {"data_source": "math_dapo", "prompt": [{"role": "user", "content": "q"}], "reward_model": {"ground_truth": "1"}},
        {"data_source": "math_dapo", "prompt": [], "reward_model": {"ground_truth": "1"}},
    ]
    assert check_dataset_rows(rows[:1]) == 1
    with pytest.raises(MalformedRowError, match="row #1 .*prompt is empty"):
        check_dataset_rows(rows)


def test_result_shapes():
    assert success_result(0.5) == {"score": 0.5, "reward_failed": False, "reward_error": ""}
    full = success_result({"score": 1, "acc": True, "pred": "3", "tool_calls": 2})
    assert full["score"] == 1.0 and isinstance(full["score"], float)
    failed = failure_result(template_of(full), -1.0, "why")
    assert set(failed) == set(full)
    assert failed == {"score": -1.0, "acc": False, "pred": "[REWARD_FAILED]", "tool_calls": 0, "reward_failed": True, "reward_error": "why"}
    assert set(failure_result(DEFAULT_TEMPLATE, -1.0, "x")) == {"score", "acc", "pred", "reward_failed", "reward_error"}
    for bad in ("1.0", True, {"acc": True}, None):
        with pytest.raises(TypeError):
            success_result(bad)
