"""Hermes tool-call parsing: valid calls parse, malformed ones give a message, never a crash."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opd.agent.tool_calls import ToolCall, ToolCallError, last_open_call, parse_tool_call


def test_parses_object_and_string_arguments() -> None:
    assert parse_tool_call('{"name": "calculator", "arguments": {"expr": "1+1"}}') == ToolCall("calculator", {"expr": "1+1"})
    assert parse_tool_call('{"name": "calculator", "arguments": "{\\"expr\\": \\"2\\"}"}').arguments == {"expr": "2"}


@pytest.mark.parametrize("body", ["", "{", "[1]", '{"arguments": {}}', '{"name": 3}', '{"name": "x", "arguments": [1]}', "{'name': 'calculator'}", "[" * 100_000])
def test_malformed_calls_raise_tool_call_error(body: str) -> None:
    with pytest.raises(ToolCallError):
        parse_tool_call(body)


def test_last_open_call_finds_the_body() -> None:
    text = 'a <tool_call>\n{"name": "x"}\n</tool_call> b <tool_call>\n{"name": "y"}\n</tool_call>'
    assert last_open_call(text).strip() == '{"name": "y"}'
    assert last_open_call("no call </tool_call>") is None
    assert last_open_call("<tool_call>{}") is None


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=500))
def test_arbitrary_text_never_raises_anything_else(text: str) -> None:
    try:
        call = parse_tool_call(text)
    except ToolCallError:
        pass
    else:
        assert isinstance(call.name, str) and call.name and isinstance(call.arguments, dict)
    body = last_open_call(text)
    if body is None:
        assert not text.rstrip().endswith("</tool_call>") or "<tool_call>" not in text.rstrip()[: -len("</tool_call>")]
    else:
        assert text.rstrip().endswith(f"<tool_call>{body}</tool_call>") and "<tool_call>" not in body


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["<tool_call>", "</tool_call>", "x", "{}", "\n", " "]), max_size=20).map("".join))
def test_last_open_call_is_the_text_between_the_last_tags(text: str) -> None:
    body = last_open_call(text)
    stripped = text.rstrip()
    if stripped.endswith("</tool_call>") and "<tool_call>" in stripped[: -len("</tool_call>")]:
        start = stripped[: -len("</tool_call>")].rfind("<tool_call>") + len("<tool_call>")
        assert body == stripped[start : -len("</tool_call>")]
    else:
        assert body is None
