"""A tool call as data (`ToolCall`, or a `ToolCallError` whose message is shown to the model) and
running a parsed call against a `Toolbox`.

The family's own format is parsed by vLLM's parsers (`opd.agent.chat_format`); what is here reads
a JSON call body to explain why the parser refused it (`parse_tool_call`: what the model can fix)
and writes a call as the fixture's prompts and transcripts show it (`tool_call_text`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from opd.tools.registry import Toolbox, ToolOutcome
from opd.tracking.traces import Tracer

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class ToolCallError(ValueError):
    """The text is not a well-formed tool call; the message is shown to the model as the result."""


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """A tool call exactly as the model is asked to write it (valid JSON in Hermes tags)."""
    return f"{OPEN}\n" + json.dumps({"name": name, "arguments": arguments}) + f"\n{CLOSE}"


def parse_tool_call(body: str, max_chars: int = 20_000) -> ToolCall:
    """Parse the JSON between the tags. `arguments` may be an object or a JSON string of one."""
    if len(body) > max_chars:
        raise ToolCallError(f"tool call longer than {max_chars} characters")
    try:
        data = json.loads(body.strip())
    except (ValueError, RecursionError) as err:  # JSON errors, and integers past Python's digit limit
        raise ToolCallError(f"tool call is not valid JSON: {getattr(err, 'msg', err)}") from None
    if not isinstance(data, dict):
        raise ToolCallError('tool call must be a JSON object {"name": ..., "arguments": {...}}')
    name, arguments = data.get("name"), data.get("arguments", {})
    if not isinstance(name, str) or not name:
        raise ToolCallError('tool call has no "name" string')
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):  # JSON errors, and integers past Python's digit limit
            raise ToolCallError('"arguments" is a string that is not a JSON object') from None
    if not isinstance(arguments, dict):
        raise ToolCallError('"arguments" must be a JSON object')
    return ToolCall(name, arguments)


async def run_parsed_call(toolbox: Toolbox, call: ToolCall | ToolCallError, tracer: Tracer) -> ToolOutcome:
    """Run one parsed call (a `tool <name>` span when tracing); a parse error is a `malformed` outcome."""
    if isinstance(call, ToolCallError):
        return ToolOutcome("malformed", error=str(call))
    with tracer.span(f"tool {call.name}", "TOOL", call.arguments) as span:
        outcome = await toolbox.run(call.name, call.arguments)
        span.outputs({"status": outcome.status, "content": outcome.content, "error": outcome.error})
    return outcome
