"""`code_interpreter`: a verl `BaseTool` that runs the model's Python in a sandbox.

Used by verl's `tool_agent` agent loop (hermes format). Declared in a tool YAML as
`class_name: verl_laminar.tools.code_interpreter.CodeInterpreterTool`; verl builds one instance per
agent-loop worker, so the concurrency limit is per worker.

Backend: the local bubblewrap sandbox by default; a SandboxFusion-compatible service when
`sandbox_fusion_url` is set. The local sandbox is probed when the tool is built, so a machine that cannot
sandbox fails at start-up instead of feeding "tool error" text to every trajectory.
"""

from __future__ import annotations

import logging
from typing import Any, Optional, Protocol

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.utils.rollout_trace import rollout_trace_op

from verl_laminar.sandbox.result import SandboxResult, SandboxStatus
from verl_laminar.sandbox.runner import LocalSandbox
from verl_laminar.tools.config import CodeInterpreterConfig
from verl_laminar.tools.formatting import BadToolCall, extract_code, metrics, render
from verl_laminar.tools.remote import RemoteSandbox, RemoteSandboxError

logger = logging.getLogger(__name__)

TOOL_NAME = "code_interpreter"


class Backend(Protocol):
    async def arun(self, code: str) -> SandboxResult: ...


def default_schema() -> OpenAIFunctionToolSchema:
    return OpenAIFunctionToolSchema.model_validate(
        {
            "type": "function",
            "function": {
                "name": TOOL_NAME,
                "description": (
                    "Run Python 3 code in a fresh sandbox (no network, no state kept between calls) and return "
                    "its stdout and stderr. Print every value you need to see."
                ),
                "parameters": {
                    "type": "object",
                    "properties": {"code": {"type": "string", "description": "Python source code to run."}},
                    "required": ["code"],
                },
            },
        }
    )


def make_backend(settings: CodeInterpreterConfig) -> Backend:
    if settings.remote:
        logger.info("code_interpreter runs code at %s", settings.sandbox_fusion_url)
        return RemoteSandbox(
            settings.sandbox_fusion_url,
            timeout_s=settings.timeout_s,
            memory_mb=int(settings.memory_mb),
            max_concurrency=int(settings.max_concurrency),
            grace_s=settings.remote_grace_s,
        )
    sandbox = LocalSandbox(settings.sandbox_config())
    sandbox.check()
    return sandbox


class CodeInterpreterTool(BaseTool):
    def __init__(self, config: dict, tool_schema: Optional[OpenAIFunctionToolSchema] = None, backend: Backend | None = None):
        self.settings = CodeInterpreterConfig.from_mapping(config)
        super().__init__(config, tool_schema or default_schema())
        # `backend` lets tests and embedders inject one; verl passes only config and schema.
        self.backend = backend if backend is not None else make_backend(self.settings)

    @rollout_trace_op
    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        try:
            code = extract_code(parameters)
        except BadToolCall as e:
            return ToolResponse(text=f"Error: {e}"), 0.0, {"status": "bad_call"}
        try:
            result = await self.backend.arun(code)
        except RemoteSandboxError as e:
            # The service's fault, not the model's: say so, log it, keep the rollout going.
            logger.warning("code_interpreter: %s", e)
            return ToolResponse(text="Error: the code sandbox is unavailable; try again."), 0.0, {"status": "sandbox_error"}
        if result.status is SandboxStatus.TIMEOUT:
            # The model is told in the response; the operator needs the call and the setting that bounds it.
            logger.info("code_interpreter call %s timed out after %.1fs and was killed (tool config timeout_s=%s: "
                        "raise it in the tool YAML if correct code needs longer)", instance_id, result.wall_s,
                        self.settings.timeout_s)
        return ToolResponse(text=render(result, self.settings.max_output_chars)), 0.0, metrics(result)
