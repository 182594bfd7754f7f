"""Data set row validation: every bad row is named with its reasons; filter mode keeps every good row."""

import copy
import logging
import math

import numpy as np
import pandas as pd
import pytest

from verl_laminar.data import TOY_MATH_DIR
from verl_laminar.data.make_toy_math import make_rows
from verl_laminar.data.tool_math import to_tool_rows
from verl_laminar.data.validate import DatasetRowsError, chat_token_counter, main, row_problems, validate_rows
from verl_laminar.reward.rows import MalformedRowError

GOOD = make_rows(1, seed=0, split="train")[0]
_DROP = object()  # marks a field to remove from the row


def _with(**changes):
    row = copy.deepcopy(GOOD)
    for key, value in changes.items():
        if value is _DROP:
            row.pop(key)
        else:
            row[key] = value
    return row


@pytest.mark.parametrize(
    "row, fragment",
    [
        (_with(prompt=_DROP), "prompt is missing"),
        (_with(prompt=None), "prompt is missing"),
        (_with(prompt=math.nan), "prompt is missing"),
        (_with(prompt=[]), "prompt is empty"),
        (_with(prompt="What is 1 + 1?"), "prompt is a plain string"),
        (_with(prompt=7), "prompt is a int"),
        (_with(prompt=["hi"]), r"prompt\[0\] is a str"),
        (_with(prompt=[{"role": "human", "content": "hi"}]), r"prompt\[0\].role='human' is not one of"),
        (_with(prompt=[{"role": "user", "content": 5}]), r"prompt\[0\].content must be a string"),
        (_with(prompt=[{"role": "user", "content": "   "}]), "no user message with text"),
        (_with(prompt=[{"role": "system", "content": "be brief"}]), "no user message with text"),
        (_with(reward_model=_DROP), "reward_model is missing"),
        (_with(reward_model="42"), "reward_model is a str, not a mapping"),
        (_with(reward_model={"style": "rule"}), "ground_truth is missing or empty"),
        (_with(reward_model={"ground_truth": ""}), "ground_truth is missing or empty"),
        (_with(reward_model={"ground_truth": math.nan}), "ground_truth is missing or empty"),
        (_with(reward_model={"ground_truth": {"a": 1}}), "ground_truth has unsupported type dict"),
        (_with(data_source=_DROP), "data_source must be a non-empty string"),
        (_with(data_source=""), "data_source must be a non-empty string"),
        (_with(data_source=3), "data_source must be a non-empty string"),
        (_with(extra_info="index=0"), "extra_info must be a mapping or null"),
        (_with(agent_name=""), "agent_name must be a non-empty string"),
        ("not a row", "is a str, expected a mapping"),
    ],
)
def test_each_malformed_row_is_named_with_its_reason(row, fragment):
    with pytest.raises(DatasetRowsError, match=fragment) as info:
        validate_rows([GOOD, row, GOOD])
    message = str(info.value)
    assert isinstance(info.value, MalformedRowError) and isinstance(info.value, ValueError)
    assert "1 of 3 rows are malformed" in message and "row #1" in message
    assert "--write-good" in message  # the fix for keeping the good rows


@pytest.mark.parametrize(
    "row",
    [
        GOOD,
        _with(prompt=np.array(GOOD["prompt"], dtype=object)),  # as parquet returns it
        _with(reward_model={"ground_truth": 3}),
        _with(reward_model={"ground_truth": np.array(["3", "three"])}),
        _with(extra_info=None),
        _with(extra_info=_DROP),
        _with(agent_name="tool_agent"),
        _with(agent_name=None),  # a column present in other rows only
        _with(prompt=[{"role": "system", "content": "s"}, {"role": "user", "content": "q"},
                      {"role": "assistant", "content": None, "tool_calls": [{"name": "f"}]}]),
    ],
)
def test_good_rows_pass(row):
    assert row_problems(row) == []


def test_a_row_with_several_problems_reports_them_all():
    bad = _with(data_source="", prompt=[], reward_model={})
    (problem,) = validate_rows([bad], mode="filter")[1]
    assert len(problem.reasons) == 3
    assert "data_source" in problem.message() and "prompt is empty" in problem.message()
    assert "ground_truth" in problem.message()


def test_filter_keeps_every_good_row_in_order_and_reports_every_bad_one(caplog):
    rows = make_rows(6, seed=1, split="train")
    rows[1]["prompt"] = []
    rows[4]["reward_model"] = {"style": "rule"}
    with caplog.at_level(logging.WARNING, logger="verl_laminar.data.validate"):
        good, bad = validate_rows(rows, mode="filter")
    assert [r["extra_info"]["index"] for r in good] == [0, 2, 3, 5]
    assert all(g is rows[i] for g, i in zip(good, [0, 2, 3, 5]))  # unchanged, not copies
    assert [b.index for b in bad] == [1, 4]
    assert "index=1" in bad[0].label and "split='train'" in bad[0].label
    assert "row #1" in caplog.text and "row #4" in caplog.text

    with pytest.raises(DatasetRowsError) as info:
        validate_rows(rows)
    assert "2 of 6 rows" in str(info.value) and "row #1" in str(info.value) and "row #4" in str(info.value)


def test_long_reports_are_capped():
    rows = [_with(prompt=[])] * 25
    with pytest.raises(DatasetRowsError, match=r"25 of 25 rows(.|\n)*and 5 more"):
        validate_rows(rows)


def _words(messages):
    return sum(len(m["content"].split()) for m in messages)


def test_overlong_prompts_are_named_with_the_limit_and_the_keys():
    rows = [_with(prompt=[{"role": "user", "content": " ".join(["w"] * n)}]) for n in (3, 12, 5)]
    good, bad = validate_rows(rows, mode="filter", prompt_tokens=_words, max_prompt_length=5)
    assert good == [rows[0], rows[2]]
    (problem,) = bad
    assert problem.index == 1
    message = problem.message()
    for fragment in ("row #1", "12 tokens", "limit of 5", "data.max_prompt_length",
                     "actor_rollout_ref.rollout.prompt_length"):
        assert fragment in message


def test_a_prompt_the_template_rejects_is_a_bad_row_not_a_crash():
    def template(messages):
        if "boom" in messages[-1]["content"]:
            raise ValueError("unsupported role order")
        return 1

    rows = [GOOD, _with(prompt=[{"role": "user", "content": "boom"}])]
    good, bad = validate_rows(rows, mode="filter", prompt_tokens=template, max_prompt_length=10)
    assert good == [GOOD] and "cannot be tokenized" in bad[0].message() and "unsupported role order" in bad[0].message()


@pytest.mark.parametrize("kwargs, fragment", [
    ({"mode": "drop"}, "mode='drop'"),
    ({"prompt_tokens": _words}, "go together"),
    ({"prompt_tokens": _words, "max_prompt_length": 0}, "invalid"),
])
def test_bad_arguments_are_config_errors(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment) as info:
        validate_rows([GOOD], **kwargs)
    assert not isinstance(info.value, MalformedRowError)


def test_shipped_and_derived_sets_are_clean():
    for split in ("train", "val"):
        rows = pd.read_parquet(TOY_MATH_DIR / f"{split}.parquet").to_dict(orient="records")
        good, bad = validate_rows(rows)
        assert bad == [] and len(good) == len(rows)
        assert validate_rows(to_tool_rows(rows, "laminar_tool_guided"))[1] == []


def test_cli_reports_and_writes_only_the_good_rows(tmp_path, caplog):
    rows = make_rows(5, seed=2, split="val")
    rows[2]["reward_model"] = {"ground_truth": None, "style": "rule"}
    rows[3]["prompt"] = []
    src = tmp_path / "in.parquet"
    pd.DataFrame(rows).to_parquet(src, index=False)
    with caplog.at_level(logging.INFO, logger="verl_laminar.data.validate"):
        assert main([str(src)]) == 1
    assert "row #2" in caplog.text and "row #3" in caplog.text and "3 good rows, 2 bad" in caplog.text

    out = tmp_path / "clean" / "good.parquet"
    assert main([str(src), "--write-good", str(out)]) == 0
    written = pd.read_parquet(out)
    assert list(written["extra_info"].map(lambda e: e["index"])) == [0, 1, 4]
    assert main([str(out)]) == 0


def test_cli_needs_both_tokenizer_and_limit(tmp_path):
    with pytest.raises(SystemExit):
        main([str(tmp_path / "x.parquet"), "--max-prompt-length", "10"])


def test_chat_token_counter_uses_the_generation_prompt():
    class Tokenizer:
        def apply_chat_template(self, messages, add_generation_prompt, tokenize):
            assert add_generation_prompt and tokenize
            return {"input_ids": list(range(_words(messages) + 3))}

    assert chat_token_counter(Tokenizer())([{"role": "user", "content": "a b"}]) == 5


def test_cli_measures_prompts_with_the_real_chat_template(tmp_path, caplog, tiny_model_dir):
    rows = make_rows(3, seed=3, split="train")
    rows[1]["prompt"] = [{"role": "user", "content": "What is 1 + 1? " * 200}]
    src = tmp_path / "in.parquet"
    pd.DataFrame(rows).to_parquet(src, index=False)
    out = tmp_path / "good.parquet"
    args = [str(src), "--tokenizer", str(tiny_model_dir), "--max-prompt-length", "256", "--write-good", str(out)]
    with caplog.at_level(logging.INFO, logger="verl_laminar.data.validate"):
        assert main(args) == 0
    assert "row #1" in caplog.text and "limit of 256" in caplog.text and "2 good rows, 1 bad" in caplog.text
    assert len(pd.read_parquet(out)) == 2
