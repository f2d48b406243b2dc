"""Hermes tool-call parsing: valid calls parse, malformed ones give a message, never a crash."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opd.agent.tool_calls import ToolCall, ToolCallError, parse_tool_call


def test_parses_object_and_string_arguments() -> None:
    assert parse_tool_call('{"name": "calculator", "arguments": {"expr": "1+1"}}') == ToolCall("calculator", {"expr": "1+1"})
    assert parse_tool_call('{"name": "calculator", "arguments": "{\\"expr\\": \\"2\\"}"}').arguments == {"expr": "2"}


@pytest.mark.parametrize("body", ["", "{", "[1]", '{"arguments": {}}', '{"name": 3}', '{"name": "x", "arguments": [1]}', "{'name': 'calculator'}", "[" * 100_000])
def test_malformed_calls_raise_tool_call_error(body: str) -> None:
    with pytest.raises(ToolCallError):
        parse_tool_call(body)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=500))
def test_arbitrary_text_never_raises_anything_else(text: str) -> None:
    try:
        call = parse_tool_call(text)
    except ToolCallError:
        pass
    else:
        assert isinstance(call.name, str) and call.name and isinstance(call.arguments, dict)




def test_a_json_integer_past_pythons_digit_limit_is_a_malformed_call() -> None:
    body = '{"name": "calculator", "arguments": {"expr": ' + "9" * 5000 + "}}"
    with pytest.raises(ToolCallError, match="not valid JSON"):
        parse_tool_call(body)
    with pytest.raises(ToolCallError):
        parse_tool_call('{"name": "calculator", "arguments": "{\\"expr\\": ' + "9" * 5000 + '}"}')


@pytest.mark.parametrize("field", ["expr", "path", "content"])
def test_a_lone_surrogate_in_an_argument_is_a_malformed_call_not_a_crash(field: str) -> None:
    """JSON's "\\ud800" escape makes a str that no file, process or tokenizer accepts: refused
    before any tool runs, with a message the tokenizer can encode."""
    import asyncio

    from conftest import sandbox_limits
    from opd.tools import math_tools
    from opd.tools import workspace as workspace_tools
    from opd.tools.calculator import CalculatorLimits
    from opd.tools.registry import Toolbox
    from opd.tools.workspace import Workspace

    bad = "x\ud800"
    if field == "expr":
        outcome = asyncio.run(Toolbox(math_tools.TOOLS, math_tools.MathTools(CalculatorLimits(), sandbox_limits())).run("calculator", {"expr": bad}))
    else:
        workspace = Workspace(sandbox_limits())
        try:
            arguments = {"path": "a.py", "content": "x = 1"} | {field: bad}
            outcome = asyncio.run(Toolbox(workspace_tools.TOOLS, workspace).run("write_file", arguments))
        finally:
            asyncio.run(workspace.close())
    assert outcome.status == "malformed" and "not valid Unicode" in (outcome.error or "")
    outcome.as_text().encode("utf-8")
