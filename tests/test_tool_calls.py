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


