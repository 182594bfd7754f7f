"""verl's single-turn agent loop with a seeded per-trajectory response length (the skewed CPU workload).

Selected with ``actor_rollout_ref.rollout.agent.default_agent_loop=laminar_skewed`` and
``actor_rollout_ref.rollout.agent.agent_loop_config_path=recipes/cpu/skewed_agent_loop.yaml`` (identically in
the sync baseline and under ``+laminar=enabled``). Each response of prompt ``index`` gets exactly
``SkewedLengths.length(index, session_id)`` tokens: ``max_tokens`` with ``ignore_eos`` keeps vLLM from stopping at
end-of-turn, so generation cost follows the long-tailed distribution and not the tiny model's short answers.
Not ``min_tokens == max_tokens``: verl's client resumes an aborted request (separate_async's global weight sync)
with ``max_tokens`` reduced by what was generated but the same ``min_tokens``, which vLLM then rejects.
The reward reads only the first answer line of what the model wrote before its first end-of-turn (or any other
special) token: with ``ignore_eos`` vLLM goes on past that token, and the decoded text, which drops special tokens,
would run the continuation into the answer ("Answer: 5" + end-of-turn + "23" reads "Answer: 523"). Which model a
fixture build yields differs by machine, and one that ends its answers with that token scored -1 on every response.
So the loop puts the text up to that token in the output's ``extra_fields["answer_text"]``, which verl hands to the
reward's ``extra_info`` (``verl_laminar.reward.first_answer``).
"""

from __future__ import annotations

import logging
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

from verl_laminar.policy.lengths import SkewedLengths

logger = logging.getLogger(__name__)


class SkewedLengthAgentLoop(SingleTurnAgentLoop):
    def __init__(self, *args: Any, median: int = 32, p99_ratio: float = 10.0, min_tokens: int = 16,
                 seed: int = 20261130, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lengths = SkewedLengths(max_tokens=int(self.response_length), median=int(median),
                                     p99_ratio=float(p99_ratio), min_tokens=int(min_tokens), seed=int(seed))
        self._special_ids = set(self.tokenizer.all_special_ids)  # where a response's answer ends

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        if "index" not in kwargs or "session_id" not in kwargs:
            raise KeyError("laminar_skewed needs the row's 'index' (extra_info.index) and verl's 'session_id' to "
                           f"key the length; got keys {sorted(kwargs)}")
        n = self.lengths.length(int(kwargs["index"]), int(kwargs["session_id"]))
        output = await super().run(dict(sampling_params, max_tokens=n, ignore_eos=True), **kwargs)
        output.extra_fields["answer_text"] = self.tokenizer.decode(
            answer_tokens(output.response_ids, self._special_ids), skip_special_tokens=True)
        return output


def answer_tokens(response_ids: list, special_ids: set) -> list:
    """The response up to (without) its first special token: what the model wrote before it would have stopped."""
    for i, t in enumerate(response_ids):
        if int(t) in special_ids:
            return list(response_ids[:i])
    return list(response_ids)
