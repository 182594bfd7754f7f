"""The structured-output regex of the CPU tool-calling workload: every string it admits is a call verl dispatches."""

import asyncio
import itertools
import json
import re

import pytest
from verl.experimental.agent_loop.tool_parser import HermesToolParser

from verl_laminar.tools.formatting import extract_code
from verl_laminar.tools.guided import MAX_OPERANDS, hermes_call_regex, operands


class _TextTokenizer:
    """verl's parser only decodes; the 'ids' here are the text itself."""

    def decode(self, ids):
        return ids


def _parse(text):
    return asyncio.run(HermesToolParser(_TextTokenizer()).extract_tool_calls(text, None))


def _call(a, op, b, name="code_interpreter"):
    args = {"code": f"print({a} {op} {b})"}
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


@pytest.mark.parametrize("problem, expected", [
    ("What is 12 + 7?", ["12", "7"]),
    ("What is 3 times 3?", ["3"]),
    ("What is 9 - 0?", ["9", "0"]),
    ("No numbers here", []),
    ("1 2 3 4 5 6 7 8 9 10", [str(i) for i in range(1, MAX_OPERANDS + 1)]),
])
def test_operands(problem, expected):
    assert operands(problem) == expected


def test_every_admitted_call_parses_and_dispatches():
    rx = re.compile(hermes_call_regex("code_interpreter", ["12", "7"]))
    for a, op, b in itertools.product(["12", "7"], "+-*", ["12", "7"]):
        text = _call(a, op, b)
        assert rx.fullmatch(text), text
        content, calls = _parse(text)
        assert content.strip() == "" and len(calls) == 1
        assert calls[0].name == "code_interpreter"
        code = extract_code(json.loads(calls[0].arguments))
        assert eval(code.replace("print", "")) == eval(f"{a} {op} {b}")  # the code computes what it says


@pytest.mark.parametrize("text", [
    _call("13", "+", "7"),                      # a number not in the problem
    _call("12", "/", "7"),                      # an operator not allowed
    _call("12", "+", "7", name="other_tool"),   # another tool
    _call("12", "+", "7").replace("\n</tool_call>", ""),  # unterminated
    "Answer: 19",
])
def test_regex_rejects(text):
    assert not re.fullmatch(hermes_call_regex("code_interpreter", ["12", "7"]), text)


def test_without_numbers_any_small_integers():
    rx = hermes_call_regex("code_interpreter", [])
    assert re.fullmatch(rx, _call("123", "*", "4"))
    assert not re.fullmatch(rx, _call("1234", "*", "4"))


def test_longer_numbers_win_alternation():
    # "12" must not be cut to "1" by an alternation that tries the shorter operand first
    assert re.fullmatch(hermes_call_regex("code_interpreter", ["1", "12"]), _call("12", "+", "1"))


@pytest.mark.parametrize("name, operators", [("bad name", "+"), ("code_interpreter", ""), ("code_interpreter", "+^")])
def test_bad_arguments_raise(name, operators):
    with pytest.raises(ValueError):
        hermes_call_regex(name, ["1"], operators)


def test_vllm_structured_output_backend_compiles_it():
    import xgrammar as xgr  # vLLM depends on it
    grammar = xgr.Grammar.from_regex(hermes_call_regex("code_interpreter", operands("What is 45 + 38?")))
    assert str(grammar).startswith("root ::=") and '("4" "5")' in str(grammar)  # the operands are in it
