"""Tools as data: a name, a description, string parameters and a coroutine that runs it.

A module's tools are a `Registry` (opd.registry, as every plug-in point's): `toolset(...)` names
them, refusing a name given twice. A `Toolbox` is the set of tools one rollout may call, bound to
that rollout's context (its workspace, its sandbox limits). It gives the schemas the chat template
shows the model, and runs a call by name: an unknown tool (answered with the nearest name, if one
is close) or a missing or non-string argument is a `malformed` outcome (nothing ran); a tool that
raises `ToolError` is an `error` outcome (it ran and failed, and may still return content, e.g. a
program's stderr); anything else is `ok`. Every outcome is something to show the model, never an
exception.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable, Union

from opd.registry import Registry


class ToolError(Exception):
    """A tool refused its arguments or failed; the message (and any content) is shown to the model."""

    def __init__(self, message: str, content: Any = None) -> None:
        super().__init__(message)
        self.content = content


@dataclass(frozen=True)
class Tool:
    """One tool. Every parameter is a required string, listed as (name, description)."""

    name: str
    description: str
    parameters: tuple[tuple[str, str], ...]
    # (context, arguments) -> content shown to the model; raises ToolError on failure.
    run: Callable[[Any, dict[str, str]], Awaitable[Any]]

    def schema(self) -> dict[str, Any]:
        """The OpenAI function schema (what chat templates render as the tool list)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {
                    "type": "object",
                    "properties": {key: {"type": "string", "description": text} for key, text in self.parameters},
                    "required": [key for key, _ in self.parameters],
                },
            },
        }


@dataclass(frozen=True)
class ToolOutcome:
    """What one call gave: `status` ok | error | malformed, the tool's content and/or an error."""

    status: str
    name: str | None = None
    content: Any = None
    error: str | None = None

    @property
    def ran(self) -> bool:
        """The call reached a tool (its result may be an error)."""
        return self.status != "malformed"

    def as_text(self) -> str:
        """The result as a chat tool message: the content, else `error: <why>`."""
        return str(self.content) if self.content is not None else f"error: {self.error}"


# Tools by name (`toolset`), or a sequence of them.
Tools = Union[Registry[Tool], Iterable[Tool]]


def toolset(tools: Tools) -> Registry[Tool]:
    """`tools` by name, in order (a Registry as it is); a name given twice is a DuplicateName."""
    if isinstance(tools, Registry):
        return tools
    found: Registry[Tool] = Registry("tool")
    for tool in tools:
        found.add(tool.name, tool)
    return found


def schemas(tools: Tools) -> list[dict[str, Any]]:
    return [tool.schema() for tool in toolset(tools).values()]


class Toolbox:
    """The tools of one rollout, bound to its context."""

    def __init__(self, tools: Tools, context: Any = None) -> None:
        self.tools = toolset(tools)
        self.context = context

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.tools.names)

    def schemas(self) -> list[dict[str, Any]]:
        return schemas(self.tools)

    async def run(self, name: str, arguments: dict[str, Any]) -> ToolOutcome:
        if name not in self.tools:
            close = self.tools.nearest(name)
            hint = f"; did you mean {close}?" if close else ";"
            return ToolOutcome("malformed", name, error=f"unknown tool {name!r}{hint} available: {', '.join(self.tools.names)}")
        tool = self.tools[name]
        for key, _ in tool.parameters:
            value = arguments.get(key)
            if not isinstance(value, str):
                return ToolOutcome("malformed", name, error=f'{name} needs a "{key}" string')
            try:  # JSON's \ud800 escapes make strings that no file, process or tokenizer takes
                value.encode("utf-8")
            except UnicodeEncodeError as err:
                return ToolOutcome("malformed", name, error=f'the "{key}" string of {name} is not valid Unicode ({err.reason} at {err.start})')
        try:
            return ToolOutcome("ok", name, content=await tool.run(self.context, arguments))
        except ToolError as err:
            return ToolOutcome("error", name, content=err.content, error=str(err))
