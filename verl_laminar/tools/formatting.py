"""Pure helpers between the model's tool call and the sandbox: extract the code, render the result as text."""

from __future__ import annotations

import re
from typing import Any

from verl_laminar.sandbox.result import SandboxResult, SandboxStatus

TRUNCATION_MARK = "\n...(output truncated)...\n"
EMPTY_OUTPUT = "(no output: print the values you need)"

# A model often wraps the argument in a markdown fence although the schema asks for plain code.
_FENCE = re.compile(r"^\s*```[a-zA-Z0-9_+-]*[ \t]*\n(?P<body>.*?)\n?```\s*$", re.DOTALL)


class BadToolCall(ValueError):
    """The tool call's arguments cannot be run; the message is shown to the model."""


def extract_code(parameters: Any) -> str:
    if not isinstance(parameters, dict):
        raise BadToolCall(f"arguments must be a JSON object with a 'code' string, got {type(parameters).__name__}")
    code = parameters.get("code")
    if not isinstance(code, str) or not code.strip():
        raise BadToolCall("missing argument 'code': pass the Python source to run as a string")
    match = _FENCE.match(code)
    return match.group("body") if match else code


def truncate_middle(text: str, limit: int) -> str:
    """Keep the head and the tail (where a traceback's last line is); cut the middle."""
    if len(text) <= limit:
        return text
    keep = max(0, limit - len(TRUNCATION_MARK))
    head = keep // 2
    tail = keep - head
    return text[:head] + TRUNCATION_MARK + (text[-tail:] if tail else "")


def render(result: SandboxResult, limit: int) -> str:
    """What the model sees: stdout, then stderr, then a status line when the run did not finish cleanly."""
    parts = []
    if result.stdout:
        parts.append(result.stdout.rstrip("\n"))
    if result.stderr:
        parts.append("[stderr]\n" + result.stderr.rstrip("\n"))
    if result.status is not SandboxStatus.OK:
        parts.append(f"[{result.describe()}]")
    text = "\n".join(parts) if parts else EMPTY_OUTPUT
    return truncate_middle(text, limit)


def metrics(result: SandboxResult) -> dict[str, Any]:
    return {
        "status": result.status.value,
        "exit_code": result.exit_code,
        "wall_s": round(result.wall_s, 4),
        "truncated": result.truncated,
    }
