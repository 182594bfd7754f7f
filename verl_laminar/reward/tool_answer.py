"""Reward for the multi-turn tool-calling task: the final `Answer:` scored like verl's math_dapo.

A tool-calling response interleaves the model's turns with tool outputs (`<tool_response>...</tool_response>`
in hermes format). Only the text after the last tool output counts: code that prints "Answer: 42" must not
earn the reward, and a response that ends on an unanswered `<tool_call>` has no final answer.
Returns math_dapo's keys plus `tool_calls`, so it can run inside `verl_laminar.reward.robust`.
"""

from __future__ import annotations

from typing import Any

NO_FINAL_ANSWER = "[NO_FINAL_ANSWER]"


def final_answer_text(solution_str: str) -> str | None:
    """The model's last turn, or None when it ends on a tool call."""
    tail = solution_str.rsplit("</tool_response>", 1)[-1]
    if "<tool_call>" in tail:
        return None
    return tail


def count_tool_calls(solution_str: str) -> int:
    return solution_str.count("<tool_call>")


def compute_score(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None, **kwargs: Any) -> dict:
    # Imported here: verl's package import pulls in torch, which a reward worker has anyway but tests may not want.
    from verl.utils.reward_score import math_dapo

    calls = count_tool_calls(solution_str)
    tail = final_answer_text(solution_str)
    if tail is None:
        return {"score": -1.0, "acc": False, "pred": NO_FINAL_ANSWER, "tool_calls": calls}
    result = dict(math_dapo.compute_score(tail, str(ground_truth)))
    result["tool_calls"] = calls
    return result
