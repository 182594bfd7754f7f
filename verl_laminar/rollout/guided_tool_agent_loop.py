"""verl's ``tool_agent`` loop with the first assistant turn(s) held to a well-formed code-interpreter call.

The CPU tool-calling workload (``TASK=tool`` in ``recipes/cpu/common.sh``), registered as ``laminar_tool_guided``
by ``recipes/cpu/tool_agent_loop.yaml``. Turn 1 is sampled by the model under vLLM structured outputs
(``verl_laminar.tools.guided.hermes_call_regex`` over the problem's numbers), so it always parses; verl's hermes
parser extracts the call, the code interpreter runs it in the local sandbox, the tool output is appended as a tool
turn and the model answers freely. Everything after the sampling constraint is verl's loop unchanged: token
merging, response mask (tool tokens masked out), rollout log-probs (vLLM reports the model's own log-probs, not
the masked ones), and, under ``+laminar=enabled``, one weight version for every turn.
"""

from __future__ import annotations

import logging
from typing import Any

from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

from verl_laminar.data.tool_math import problem_text
from verl_laminar.tools.guided import hermes_call_regex, operands

logger = logging.getLogger(__name__)


class GuidedToolAgentLoop(ToolAgentLoop):
    def __init__(self, *args: Any, guided_turns: int = 1, tool_name: str = "code_interpreter",
                 operators: str = "+-*", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if guided_turns < 0:
            raise ValueError(f"guided_turns={guided_turns} must be >= 0 (0 turns the constraint off)")
        if guided_turns and tool_name not in self.tools:
            raise ValueError(f"laminar_tool_guided constrains calls to tool {tool_name!r}, but the loaded tools are "
                             f"{sorted(self.tools)}; set actor_rollout_ref.rollout.multi_turn.tool_config_path to a "
                             "tool config that defines it (recipes/tool_calling/code_interpreter_tool.yaml)")
        self.guided_turns = int(guided_turns)
        self.tool_name = tool_name
        self.operators = operators
        self._regex: str | None = None

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        problem = problem_text(kwargs.get("extra_info"), kwargs.get("raw_prompt")) or ""
        self._regex = hermes_call_regex(self.tool_name, operands(problem), self.operators)
        return await super().run(sampling_params, **kwargs)

    async def _handle_generating_state(self, agent_data: Any, sampling_params: dict[str, Any],
                                       ignore_termination: bool = False) -> Any:
        if agent_data.assistant_turns < self.guided_turns and self._regex is not None:
            from vllm.sampling_params import StructuredOutputsParams  # the rollout worker has vLLM; tests may not

            sampling_params = {**sampling_params, "structured_outputs": StructuredOutputsParams(regex=self._regex)}
        return await super()._handle_generating_state(agent_data, sampling_params, ignore_termination)
