"""Pure bad-input checks: overlong prompts (``data.prompts``) and garbage replica output (``rollout.badinput``),
one item at a time."""

import functools
import math

import numpy as np
import pytest

from verl_laminar.data.prompts import BadInputError, PromptTooLongError, check_prompt_length, prompt_limit
from verl_laminar.reward.rows import MalformedRowError
from verl_laminar.rollout.badinput import GarbageOutputError, check_output_tokens, screen

VOCAB = 2048


@pytest.mark.parametrize("n, limit", [(0, 1), (5, 5), (511, 512)])
def test_prompt_within_the_limit_passes(n, limit):
    assert check_prompt_length(list(range(n)), limit, "row #0") == n


def test_overlong_prompt_names_the_row_length_limit_and_keys():
    with pytest.raises(PromptTooLongError) as info:
        check_prompt_length([1] * 600, 512, "row #7 row(index=7, data_source='math_dapo')")
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    for fragment in ("row #7", "index=7", "600 tokens", "limit of 512", "at least 600",
                     "data.max_prompt_length", "actor_rollout_ref.rollout.prompt_length", "max_model_len"):
        assert fragment in message


@pytest.mark.parametrize("limit", [0, -3, 1.5, True, None])
def test_a_bad_limit_is_a_config_error_not_a_bad_row(limit):
    with pytest.raises(ValueError, match="invalid") as info:
        check_prompt_length([1], limit, "row #0")
    assert not isinstance(info.value, BadInputError)


@pytest.mark.parametrize("prompt_length, max_model_len, expected", [(512, None, 512), (512, 256, 256), (128, 4096, 128)])
def test_prompt_limit(prompt_length, max_model_len, expected):
    assert prompt_limit(prompt_length, max_model_len) == expected


@pytest.mark.parametrize(
    "tokens, log_probs",
    [
        ([], []),
        ([0, 5, VOCAB - 1], [-0.1, -2.0, 0.0]),
        ([3, 4], None),  # log-probs not requested
        (np.array([1, 2], dtype=np.int64), np.array([-1.0, -0.5], dtype=np.float32)),
        ((7,), (-math.inf,)),  # -inf is a real (if extreme) log-probability
        ([9], [5e-4]),  # engine rounding just above zero
    ],
)
def test_good_output_passes(tokens, log_probs):
    assert check_output_tokens(tokens, log_probs, VOCAB, "req-1") == len(tokens)


@pytest.mark.parametrize(
    "tokens, log_probs, fragment",
    [
        ([1, VOCAB, 3], [-1.0] * 3, rf"token_ids\[1\]={VOCAB} is >= vocab_size {VOCAB}"),
        ([1, -1], None, r"token_ids\[1\]=-1 is negative"),
        ([1, 2.0], None, r"token_ids\[1\]=2.0 is not an integer"),
        ([True], None, r"token_ids\[0\]=True is not an integer"),
        ([None, 1], None, r"token_ids\[0\]=None is not an integer"),
        ([VOCAB + i for i in range(8)], None, r"8 of 8 token ids .*\(and 3 more\)"),
        ("hello", None, "token_ids is a str"),
        ([1, 2, 3], [-1.0, -1.0], "3 token ids but 2 log-probs"),
        ([1], [-1.0, -1.0], "1 token ids but 2 log-probs"),
        ([1, 2], [-1.0, math.nan], r"log_probs\[1\] is NaN"),
        ([1], [0.7], r"log_probs\[0\] 0.7 is > 0"),
        ([1], ["x"], r"log_probs\[0\] 'x' is not a number"),
        ([1], 0.5, "log_probs is a float"),
    ],
)
def test_garbage_output_is_named(tokens, log_probs, fragment):
    with pytest.raises(GarbageOutputError, match=fragment) as info:
        check_output_tokens(tokens, log_probs, VOCAB, "req-42")
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert message.startswith("request req-42: the replica returned garbage")
    assert "keep the rest of the batch" in message and "actor_rollout_ref.model.path" in message


def test_bad_vocab_size_is_a_config_error():
    with pytest.raises(ValueError, match="vocab_size=0") as info:
        check_output_tokens([1], None, 0, "req")
    assert not isinstance(info.value, BadInputError)


def test_screen_keeps_every_good_output_and_names_each_bad_one():
    outputs = [
        {"id": "a", "tokens": [1, 2], "lps": [-1.0, -1.0]},
        {"id": "b", "tokens": [1, -5], "lps": [-1.0, -1.0]},
        {"id": "c", "tokens": [3], "lps": [-0.2]},
        {"id": "d", "tokens": [1, 2], "lps": [-1.0]},
        {"id": "e", "tokens": [VOCAB - 1], "lps": None},
    ]
    kept, rejected = screen(outputs, lambda o: check_output_tokens(o["tokens"], o["lps"], VOCAB, o["id"]))
    assert [o["id"] for o in kept] == ["a", "c", "e"]
    assert [r.index for r in rejected] == [1, 3]
    assert "request b" in rejected[0].reason and "negative" in rejected[0].reason
    assert "request d" in rejected[1].reason and "2 token ids but 1 log-probs" in rejected[1].reason


def test_screen_prompts_and_rows_but_not_config_errors():
    prompts = [[1] * 3, [1] * 9, [1] * 4]
    kept, rejected = screen(prompts, lambda p: check_prompt_length(p, 4, f"prompt of {len(p)}"))
    assert kept == [prompts[0], prompts[2]]
    assert [r.index for r in rejected] == [1] and "9 tokens" in rejected[0].reason

    def malformed(row):
        if row is None:
            raise MalformedRowError("row: ground truth missing")

    assert screen([1, None, 2], malformed)[0] == [1, 2]
    # A configuration error (limit 0) must stop the caller, not silently reject every item.
    with pytest.raises(ValueError, match="invalid"):
        screen(prompts, functools.partial(check_prompt_length, limit=0, row_label="x"))
