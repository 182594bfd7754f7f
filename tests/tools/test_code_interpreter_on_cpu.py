"""The code-interpreter tool as verl builds it from the recipe's tool YAML, running code in the local sandbox."""

import asyncio
import pathlib
import shutil
import time

import pytest
from verl.tools.tool_registry import initialize_tools_from_config

from verl_laminar.tools.code_interpreter import CodeInterpreterTool
from verl_laminar.tools.config import CodeInterpreterConfig, ToolConfigError
from verl_laminar.tools.formatting import TRUNCATION_MARK

REPO = pathlib.Path(__file__).resolve().parents[2]
TOOL_YAML = REPO / "recipes" / "tool_calling" / "code_interpreter_tool.yaml"

needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap not installed: apt-get install -y bubblewrap"
)


def _run(tool, parameters):
    return asyncio.run(tool.execute("instance-0", parameters))


@needs_bwrap
def test_recipe_yaml_builds_a_working_tool_through_verl():
    tools = initialize_tools_from_config(str(TOOL_YAML))
    assert len(tools) == 1
    tool = tools[0]
    assert isinstance(tool, CodeInterpreterTool)
    assert tool.name == "code_interpreter"
    assert tool.tool_schema.function.parameters.required == ["code"]
    response, reward, metrics = _run(tool, {"code": "print(6 * 7)"})
    assert response.text == "42"
    assert reward == 0.0 and metrics["status"] == "ok"


@needs_bwrap
def test_errors_timeouts_and_truncation_are_reported_to_the_model():
    tool = CodeInterpreterTool({"type": "native", "timeout_s": 1, "max_output_chars": 200})
    text = _run(tool, {"code": "```python\nprint('start')\n1/0\n```"})[0].text
    assert text.startswith("start\n[stderr]\nTraceback")
    assert text.rstrip().endswith("[exited with code 1]")
    assert "ZeroDivisionError" in text

    response, _, metrics = _run(tool, {"code": "import time\nprint('waiting')\ntime.sleep(30)"})
    assert metrics["status"] == "timeout"
    assert response.text.startswith("waiting") and "timed out" in response.text

    long_text = _run(tool, {"code": "for i in range(2000):\n    print(i)\nraise KeyError('last line')"})[0].text
    assert len(long_text) <= 200
    assert TRUNCATION_MARK in long_text
    assert long_text.startswith("0\n1\n") and "KeyError: 'last line'" in long_text


def test_bad_arguments_get_an_explanation_not_an_exception():
    class NeverCalled:
        async def arun(self, code):
            raise AssertionError("must not run")

    tool = CodeInterpreterTool({}, backend=NeverCalled())
    for parameters in ({}, {"code": ""}, {"code": 5}, ["print(1)"]):
        response, _, metrics = _run(tool, parameters)
        assert response.text.startswith("Error:") and metrics["status"] == "bad_call"


@needs_bwrap
def test_concurrency_limit_holds():
    tool = CodeInterpreterTool({"max_concurrency": 2, "timeout_s": 10})

    async def burst():
        return await asyncio.gather(*(tool.execute(str(i), {"code": "import time\ntime.sleep(0.5)\nprint('done')"}) for i in range(6)))

    start = time.monotonic()
    results = asyncio.run(burst())
    elapsed = time.monotonic() - start
    assert [r[0].text for r in results] == ["done"] * 6
    # 6 calls, 2 at a time, 0.5 s each: at least 3 rounds
    assert elapsed >= 1.45


@pytest.mark.parametrize(
    "config, fragment",
    [
        ({"timeout_s": 0}, "timeout_s=0"),
        ({"max_output_chars": 10}, "max_output_chars=10"),
        ({"sandbox_fusion_url": "sandbox:8080"}, "http://"),
        ({"timeout": 5}, "unknown code_interpreter key"),
        ({"sandbox": {"memory_mb": 8}}, "memory_mb=8"),
    ],
)
def test_config_errors_name_the_value(config, fragment):
    with pytest.raises(ValueError, match=fragment):
        CodeInterpreterConfig.from_mapping(config).sandbox_config()


def test_tool_settings_flow_into_the_sandbox():
    settings = CodeInterpreterConfig.from_mapping(
        {"type": "native", "timeout_s": 3, "memory_mb": 512, "max_concurrency": 2, "sandbox": {"max_processes": 8}}
    )
    sandbox = settings.sandbox_config()
    assert (sandbox.timeout_s, sandbox.memory_mb, sandbox.max_concurrency, sandbox.max_processes) == (3, 512, 2, 8)
    assert not settings.remote
    assert issubclass(ToolConfigError, ValueError)
