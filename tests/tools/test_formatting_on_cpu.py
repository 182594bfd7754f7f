"""Pure helpers of the code-interpreter tool: code extraction and output rendering."""

import pytest

from verl_laminar.sandbox.result import SandboxResult, SandboxStatus
from verl_laminar.tools.formatting import (
    EMPTY_OUTPUT,
    TRUNCATION_MARK,
    BadToolCall,
    extract_code,
    render,
    truncate_middle,
)


@pytest.mark.parametrize(
    "code, expected",
    [
        ("print(1)", "print(1)"),
        ("```python\nprint(1)\n```", "print(1)"),
        ("```\nx = 1\nprint(x)\n```\n", "x = 1\nprint(x)"),
        ("print('```')", "print('```')"),
    ],
)
def test_extract_code(code, expected):
    assert extract_code({"code": code}) == expected


@pytest.mark.parametrize("parameters", [None, {}, {"code": "   "}, {"code": ["x"]}, {"source": "print(1)"}])
def test_extract_code_rejects(parameters):
    with pytest.raises(BadToolCall):
        extract_code(parameters)


@pytest.mark.parametrize("limit", [64, 100, 1000])
def test_truncate_middle_respects_the_limit_and_keeps_both_ends(limit):
    text = "HEAD" + "x" * 5000 + "TAIL"
    out = truncate_middle(text, limit)
    assert len(out) <= limit
    assert out.startswith("HEAD") and out.endswith("TAIL") and TRUNCATION_MARK in out
    assert truncate_middle("short", limit) == "short"


def test_render():
    ok = SandboxResult(SandboxStatus.OK, 0, "42\n", "", 0.1)
    assert render(ok, 100) == "42"
    assert render(SandboxResult(SandboxStatus.OK, 0, "", "", 0.1), 100) == EMPTY_OUTPUT
    err = SandboxResult(SandboxStatus.ERROR, 2, "a\n", "bad\n", 0.1)
    assert render(err, 100) == "a\n[stderr]\nbad\n[exited with code 2]"
