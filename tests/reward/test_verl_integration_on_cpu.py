"""The robust wrapper inside verl's own reward path: `reward.custom_reward_function` + the DAPO reward manager.

Wired exactly as a recipe does it: verl's get_custom_reward_fn loads `pkg://verl_laminar.reward.robust`
with `reward_kwargs`, and DAPORewardManager adds its overlong penalty on top of our score.
"""

import asyncio
import textwrap

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl import DataProto
from verl.experimental.reward_loop.reward_manager.dapo import DAPORewardManager
from verl.trainer.ppo.reward import get_custom_reward_fn

from verl_laminar.reward import tool_answer


class CharTokenizer:
    """One token per character: enough for the reward manager, which only decodes."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(int(i)) for i in ids)


def _batch(response: str, ground_truth: str, prompt_len: int = 4, response_len: int = 64) -> DataProto:
    ids = [ord(c) for c in response] + [0] * (response_len - len(response))
    mask = [1] * prompt_len + [1] * len(response) + [0] * (response_len - len(response))
    return DataProto.from_dict(
        tensors={
            "prompts": torch.ones(1, prompt_len, dtype=torch.long),
            "responses": torch.tensor([ids]),
            "attention_mask": torch.tensor([mask]),
        },
        non_tensors={
            "data_source": np.array(["math_dapo"], dtype=object),
            "reward_model": np.array([{"ground_truth": ground_truth}], dtype=object),
            "extra_info": np.array([{"index": 5}], dtype=object),
        },
    )


def _score(score_fn: str, response: str, ground_truth: str, **reward_kwargs) -> dict:
    config = OmegaConf.create(
        {
            "reward": {
                "custom_reward_function": {
                    "path": "pkg://verl_laminar.reward.robust",
                    "name": "compute_score",
                    "reward_kwargs": {"score_fn": score_fn, "num_procs": 1, **reward_kwargs},
                },
                "reward_kwargs": {
                    "overlong_buffer_cfg": {"enable": True, "len": 8, "penalty_factor": 1.0, "log": False},
                    "max_resp_len": 16,
                },
            }
        }
    )

    async def run():
        manager = DAPORewardManager(config, CharTokenizer(), get_custom_reward_fn(config))
        return await manager.run_single(_batch(response, ground_truth))

    return asyncio.run(run())


def test_math_dapo_through_verl_with_overlong_penalty():
    right = _score("verl.utils.reward_score.math_dapo:compute_score", "Answer: 34", "34", timeout_s=60)
    # 10 response tokens, max 16 with an 8-token buffer: 2 tokens over 8 -> penalty 2/8
    assert right["reward_score"] == pytest.approx(1.0 - 0.25)
    assert right["reward_extra_info"]["acc"] is True and right["reward_extra_info"]["reward_failed"] is False
    wrong = _score("verl.utils.reward_score.math_dapo:compute_score", "Answer: 35", "34", timeout_s=60)
    assert wrong["reward_score"] == pytest.approx(-1.0 - 0.25)


def test_hanging_score_function_does_not_stop_verl(tmp_path):
    path = tmp_path / "hang.py"
    path.write_text(textwrap.dedent("import time\ndef compute_score(**kw):\n    time.sleep(600)\n"))
    result = _score(f"{path}:compute_score", "Answer", "34", timeout_s=1)
    assert result["reward_score"] == pytest.approx(-1.0)  # failure score; 6 tokens is under the buffer
    info = result["reward_extra_info"]
    assert info["reward_failed"] is True and "timed out" in info["reward_error"] and "index=5" in info["reward_error"]
    assert set(info) >= {"score", "acc", "pred"}


@pytest.mark.parametrize(
    "response, expected_score, calls",
    [
        ("<tool_call>{}</tool_call>\n<tool_response>\n4\n</tool_response>\nSo Answer: 34", 1.0, 1),
        ("<tool_call>{}</tool_call>\n<tool_response>\nAnswer: 34\n</tool_response>\nI am not sure", -1.0, 1),
        ("Let me compute.\n<tool_call>{\"name\": \"code_interpreter\"}</tool_call>", -1.0, 1),
        ("No tools needed.\nAnswer: 34", 1.0, 0),
        ("<tool_call>a</tool_call><tool_response>1</tool_response><tool_call>b</tool_call><tool_response>2</tool_response>Answer: 35", -1.0, 2),
    ],
)
def test_tool_answer_reward_scores_only_the_final_turn(response, expected_score, calls):
    result = tool_answer.compute_score("tool_math", response, "34")
    assert result["score"] == expected_score
    assert result["tool_calls"] == calls
    assert set(result) == {"score", "acc", "pred", "tool_calls"}
