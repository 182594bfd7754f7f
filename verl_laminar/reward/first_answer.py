"""math_dapo scored on the first answer line only: the reward of the skewed-length CPU workload.

Under ``laminar_skewed`` every response runs to its drawn length (vLLM may not stop at end-of-turn), so the
tiny model keeps writing after its answer, and math_dapo, which reads the *last* ``Answer:`` in the final 300
characters, would score that continuation. This scores what the model answered first: the text is cut after
the first ``Answer:`` line, then verl's own math_dapo decides. The text is the one before the response's first
end-of-turn token when the agent loop gives it (``extra_info["answer_text"]``, ``rollout.skewed_agent_loop``). Used identically by the sync baseline and
Laminar (``reward.custom_reward_function.path=<this file>``).
"""

from __future__ import annotations

import re
from typing import Any, Optional

_FIRST_ANSWER = re.compile(r"(?i)Answer\s*:\s*[^\n]*")


def first_answer_text(solution_str: str) -> str:
    """The response up to the end of its first ``Answer:`` line (unchanged if there is none)."""
    m = _FIRST_ANSWER.search(solution_str)
    return solution_str if m is None else solution_str[: m.end()]


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Optional[dict] = None,
                  **kwargs: Any) -> dict:
    """``extra_info["answer_text"]``: the response up to its first end-of-turn token, set by ``laminar_skewed``
    (the decoded ``solution_str`` has lost that token, so an answer and its forced continuation would run together)."""
    from verl.utils.reward_score import math_dapo

    text = (extra_info or {}).get("answer_text")
    return math_dapo.compute_score(first_answer_text(solution_str if text is None else text), ground_truth)
