"""Math rows -> tool-calling rows (the tool recipes' data builder)."""

import pandas as pd
import pytest

from verl_laminar.data import TOY_MATH_DIR as TOY_DIR
from verl_laminar.data.subset import write_head
from verl_laminar.data.tool_math import DATA_SOURCE, ToolRowError, main, problem_text, to_tool_rows


def test_toy_set_converts_keeping_problem_and_truth(tmp_path):
    main(["--toy", "--agent", "laminar_tool_guided", "--out", str(tmp_path)])
    for split in ("train", "val"):
        src = pd.read_parquet(TOY_DIR / f"{split}.parquet")
        dst = pd.read_parquet(tmp_path / f"{split}.parquet")
        assert len(dst) == len(src)
        assert set(dst["agent_name"]) == {"laminar_tool_guided"} and set(dst["data_source"]) == {DATA_SOURCE}
        for (_, s), (_, d) in zip(src.iterrows(), dst.iterrows()):
            assert d["reward_model"]["ground_truth"] == s["reward_model"]["ground_truth"]
            assert d["extra_info"]["problem"] == s["extra_info"]["problem"]
            assert d["extra_info"]["problem"] in d["prompt"][0]["content"]
            assert "code_interpreter" in d["prompt"][0]["content"] and "Answer:" in d["prompt"][0]["content"]


def test_problem_falls_back_to_the_user_message():
    rows = to_tool_rows([{"prompt": [{"role": "user", "content": "What is 2 + 2?"}],
                          "reward_model": {"ground_truth": "4"}}])
    assert rows[0]["extra_info"] == {"index": 0, "problem": "What is 2 + 2?"}
    assert rows[0]["agent_name"] == "tool_agent"


@pytest.mark.parametrize("row, field", [
    ({"prompt": [{"role": "user", "content": "x"}], "reward_model": {}}, "ground_truth"),
    ({"prompt": [], "reward_model": {"ground_truth": "1"}}, "problem"),
])
def test_bad_rows_are_named(row, field):
    with pytest.raises(ToolRowError, match=rf"row 1: .*{field}"):
        to_tool_rows([{"prompt": [{"role": "user", "content": "ok"}], "reward_model": {"ground_truth": "1"}}, row])


@pytest.mark.parametrize("extra, messages, expected", [
    ({"problem": "What is 1 + 2?"}, [{"role": "user", "content": "ignored"}], "What is 1 + 2?"),
    (None, [{"role": "system", "content": "s"}, {"role": "user", "content": "a"}, {"role": "user", "content": "b"}], "b"),
    ({}, [{"role": "system", "content": "s"}], None),
    (None, None, None),
])
def test_problem_text(extra, messages, expected):
    assert problem_text(extra, messages) == expected


def test_train_head_subset(tmp_path):
    write_head(TOY_DIR, tmp_path, 32)
    head = pd.read_parquet(tmp_path / "train.parquet")
    assert head.equals(pd.read_parquet(TOY_DIR / "train.parquet").head(32))
    assert len(pd.read_parquet(tmp_path / "val.parquet")) == len(pd.read_parquet(TOY_DIR / "val.parquet"))
    for bad in (0, 10_000):
        with pytest.raises(ValueError, match="TRAIN_ROWS"):
            write_head(TOY_DIR, tmp_path / "bad", bad)
