"""A regular expression for one well-formed hermes call of the code interpreter: the CPU tool-calling workload.

The tiny fixture model was never taught tool calls and almost never writes a parseable
``<tool_call>{json}</tool_call>`` by itself, so a CPU run of verl's tool agent loop would exercise no tool at all.
The CPU variant therefore constrains the *first* assistant turn with vLLM's structured outputs to this regex:
the model still samples every token itself (which operands, which operator, its own tokenisation), vLLM only masks
tokens that would leave the call's grammar. Later turns are free. Pure code: no vllm import here.

    operands("What is 12 + 7?")            -> ["12", "7"]
    hermes_call_regex("code_interpreter", ["12", "7"]) matches
        <tool_call>\\n{"name": "code_interpreter", "arguments": {"code": "print(12 + 7)"}}\\n</tool_call>
"""

from __future__ import annotations

import re
from typing import Sequence

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
MAX_OPERANDS = 8


def operands(problem: str) -> list[str]:
    """The distinct numbers of a problem, in order of first appearance (at most MAX_OPERANDS)."""
    seen: list[str] = []
    for m in _NUMBER.findall(problem):
        if m not in seen:
            seen.append(m)
        if len(seen) == MAX_OPERANDS:
            break
    return seen


def hermes_call_regex(tool_name: str, numbers: Sequence[str], operators: str = "+-*") -> str:
    """Regex of ``<tool_call>`` + JSON ``{"name": tool_name, "arguments": {"code": "print(a OP b)"}}`` + ``</tool_call>``.

    ``a`` and ``b`` are chosen among ``numbers`` (or any 1-3 digit integer when there are none), ``OP`` among
    ``operators``. The JSON is exactly what verl's hermes parser ``json.loads`` and dispatches.
    """
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", tool_name):
        raise ValueError(f"tool name {tool_name!r} is not a plain identifier; the regex embeds it verbatim")
    if not operators or any(op not in "+-*/%" for op in operators):
        raise ValueError(f"operators {operators!r} must be a non-empty subset of '+-*/%'")
    if numbers:
        operand = "(?:" + "|".join(re.escape(n) for n in sorted(set(numbers), key=lambda s: (-len(s), s))) + ")"
    else:
        operand = "[0-9]{1,3}"
    op = "[" + "".join("\\" + o if o in "-*" else o for o in operators) + "]"
    code = rf"print\({operand} {op} {operand}\)"
    return (r'<tool_call>\n\{"name": "' + tool_name + r'", "arguments": \{"code": "' + code
            + r'"\}\}\n</tool_call>')
