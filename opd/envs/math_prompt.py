"""The inline_math prompt: system text, tool schemas, few-shot examples, tool-response text.

The fixture model is trained on transcripts rendered from these same pieces, so a change here
changes what the fixture has learnt: rebuild it (`python -m opd.fixture.build`) after editing.
"""

from __future__ import annotations

import json
from typing import Any

from opd.agent.tool_calls import tool_call_text
from opd.tools import math_tools
from opd.tools.registry import schemas

SYSTEM_PROMPT = (
    "You solve math problems. Think step by step inside <think> and </think>. While thinking you "
    "may call a tool by writing a JSON object inside <tool_call></tool_call>; its result comes back "
    "inside <tool_response></tool_response> and you keep thinking. After </think>, state the final "
    "answer as \\boxed{...}."
)

TOOLS: list[dict[str, Any]] = schemas(math_tools.TOOLS)


def tool_response_text(result: dict[str, Any]) -> str:
    """The text the environment inserts after a `</tool_call>`; masked in the record."""
    return "\n<tool_response>\n" + json.dumps(result, ensure_ascii=False) + "\n</tool_response>\n"


def solved_text(thought: str, name: str, arguments: dict[str, Any], result: dict[str, Any], answer: str) -> str:
    """One assistant turn that thinks, calls one tool, reads its result and answers."""
    return (
        f"<think>\n{thought}\n{tool_call_text(name, arguments)}{tool_response_text(result)}"
        f"The tool gives {answer}.\n</think>\n\nThe answer is \\boxed{{{answer}}}."
    )


# Static few-shot examples: (user, assistant). The tool results are what our tools return.
FEW_SHOTS: list[tuple[str, str]] = [
    (
        "What is (2 + 3) * 4?",
        solved_text("I will compute (2 + 3) * 4.", "calculator", {"expr": "(2 + 3) * 4"}, {"value": 20}, "20"),
    ),
    (
        "What is the sum of the squares of 1, 2 and 3?",
        solved_text(
            "I will add the squares with Python.",
            "python_interpreter",
            {"code": "print(sum(k * k for k in (1, 2, 3)))"},
            {"stdout": "14\n", "stderr": "", "exit_code": 0},
            "14",
        ),
    ),
]


def build_messages(
    problem: str,
    few_shots: list[tuple[str, str]],
    system_prompt: str = SYSTEM_PROMPT,
) -> list[dict[str, str]]:
    """System prompt, few-shot (user, assistant) pairs in order, then the problem."""
    messages = [{"role": "system", "content": system_prompt}]
    for user, assistant in few_shots:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    messages.append({"role": "user", "content": problem})
    return messages
