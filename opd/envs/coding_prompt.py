"""The opd_coding prompt: system text, tool schemas, the task message and tool-call text.

The fixture model is trained on transcripts rendered from these pieces; rebuild it
(`python -m opd.fixture.build`) after editing them.
"""

from __future__ import annotations

import json
from typing import Any

SYSTEM_PROMPT = (
    "You are a careful Python programmer working in a sandbox directory. Use the tools: write the "
    "solution to solution.py, run the tests with the terminal, read the errors, fix the code and run "
    "the tests again. When the tests pass, reply with a short summary and no tool call."
)


def _tool(name: str, description: str, properties: dict[str, str], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {key: {"type": "string", "description": text} for key, text in properties.items()},
                "required": required,
            },
        },
    }


TOOLS: list[dict[str, Any]] = [
    _tool("write_file", "Write a text file in the sandbox (replaces it).", {"path": "relative path", "content": "file content"}, ["path", "content"]),
    _tool("read_file", "Read a text file of the sandbox.", {"path": "relative path"}, ["path"]),
    _tool("terminal", "Run a shell command in the sandbox directory; returns its output and exit code.", {"command": "shell command"}, ["command"]),
    _tool("patch", "Replace one exact occurrence of `old` with `new` in a file.", {"path": "relative path", "old": "text to find", "new": "replacement"}, ["path", "old", "new"]),
]
TOOL_NAMES = tuple(tool["function"]["name"] for tool in TOOLS)
# The task's tests, written into each sandbox for the agent to run (the reward runs its own copy).
TEST_FILE = "test_solution.py"


def task_message(task: str) -> str:
    return f"{task}\n\nSave the solution in solution.py. The tests are in {TEST_FILE}; run them with `python {TEST_FILE}`."


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """A tool call as the model is asked to write it (valid JSON in Hermes tags)."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def initial_messages(task: str, system_prompt: str = SYSTEM_PROMPT) -> list[dict[str, str]]:
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": task_message(task)}]
