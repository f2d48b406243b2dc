"""The opd_coding prompt: system text, tool schemas and the task message.

The fixture model is trained on transcripts rendered from these pieces; rebuild it
(`python -m opd.fixture.build`) after editing them.
"""

from __future__ import annotations

from typing import Any

from opd.tools import workspace
from opd.tools.registry import schemas

SYSTEM_PROMPT = (
    "You are a careful Python programmer working in a sandbox directory. Use the tools: write the "
    "solution to solution.py, run the tests with the terminal, read the errors, fix the code and run "
    "the tests again. When the tests pass, reply with a short summary and no tool call."
)

TOOLS: list[dict[str, Any]] = schemas(workspace.TOOLS)

# The task's tests, written into each sandbox for the agent to run (the reward runs its own copy).
TEST_FILE = "test_solution.py"


def task_message(task: str, test_code: str | None = None) -> str:
    """The task; with `test_code`, the tests shown as the reference shows them."""
    tests = f"\n\nThe tests that check your solution:\n```python\n{test_code.rstrip()}\n```" if test_code else ""
    return f"{task}{tests}\n\nSave the solution in solution.py. The tests are in {TEST_FILE}; run them with `python {TEST_FILE}`."


def initial_messages(task: str, system_prompt: str = SYSTEM_PROMPT, test_code: str | None = None) -> list[dict[str, str]]:
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": task_message(task, test_code)}]
