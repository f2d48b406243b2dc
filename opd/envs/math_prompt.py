"""The inline_math prompt: system text, tool schemas, few-shot examples, tool-response text.

The fixture model is trained on transcripts rendered from these same pieces, so a change here
changes what the fixture has learnt: rebuild it (`python -m opd.fixture.build`) after editing.
Other model families get the same prompt with their own call and response text
(`system_prompt(fmt)`, `few_shots(fmt)`).
"""

from __future__ import annotations

import json
from typing import Any

from opd.agent.chat_format import ChatFormat
from opd.agent.tool_calls import tool_call_text
from opd.tools import math_tools
from opd.tools.registry import schemas

SYSTEM_PROMPT = (
    "You solve math problems. Think step by step inside <think> and </think>. While thinking you "
    "may call a tool by writing a JSON object inside <tool_call></tool_call>; its result comes back "
    "inside <tool_response></tool_response> and you keep thinking. After </think>, state the final "
    "answer as \\boxed{...}."
)

# The reference's instruction to use a tool (env.tool_instruction appends it to the system prompt).
TOOL_INSTRUCTION = "You must use a tool (calculator or python_interpreter) while thinking, and check its result before you answer."

TOOLS: list[dict[str, Any]] = schemas(math_tools.TOOLS)


def system_prompt(fmt: ChatFormat, tool_instruction: bool = False) -> str:
    """The system prompt for `fmt`: the fixture's exact text for the Hermes format, else the same
    protocol with the family's own call shown."""
    if fmt.call_template == ChatFormat().call_template and fmt.response_template == ChatFormat().response_template:
        text = SYSTEM_PROMPT
    elif fmt.harmony:
        text = ("You solve math problems. Reason step by step in your analysis channel; while reasoning you may call the "
                "calculator or python_interpreter function, and its result comes back. Then state the final answer in your "
                "final channel as \\boxed{...}.")
    else:
        # Shown as text in the system message: without an end-of-turn marker the server adds (Llama's
        # <|eot_id|>, Mistral's </s>), which would end the system message there.
        example = fmt.call_text("calculator", {"expr": "2 * 21"}).removesuffix("<|eot_id|>").removesuffix("</s>")
        text = ("You solve math problems. Think step by step inside <think> and </think>. While thinking you may call a "
                f"tool, written exactly like this: {example} Its result comes back and you keep thinking. After </think>, "
                "state the final answer as \\boxed{...}.")
    return f"{text} {TOOL_INSTRUCTION}" if tool_instruction else text


def few_shots(fmt: ChatFormat, think_opened: bool = False) -> list[tuple[str, str]]:
    """The static few-shot examples with `fmt`'s call and response text (the fixture's FEW_SHOTS
    for the Hermes format; none for Harmony, whose template takes channels as fields, not text).
    `think_opened`: the template opens `<think>` before every assistant turn (the R1 distills'),
    so the examples start inside it, as the model's own turns do."""
    if fmt.harmony:
        return []
    out = []
    opening = "" if think_opened else "<think>\n"
    for index, ((user, _), (thought, name, arguments, result, answer)) in enumerate(zip(FEW_SHOTS, _SHOTS)):
        # A Mistral result names its call's id: a fixed one per example keeps the prompt the same.
        call_id = f"example{index + 1:02d}" if fmt.tool_call_ids == "mistral" else ""
        out.append((user, f"{opening}{thought}\n{fmt.call_text(name, arguments)}{fmt.response_text(result, name, call_id)}"
                          f"The tool gives {answer}.\n</think>\n\nThe answer is \\boxed{{{answer}}}."))
    return out


def template_opens_think(fmt: ChatFormat, tokenizer: Any, tools: list[dict[str, Any]]) -> bool:
    """Whether the chat template opens `<think>` itself before an assistant turn's text (the R1
    distills' template does, for every turn)."""
    probe = "opdprobe"
    text = fmt.render(tokenizer, [{"role": "user", "content": "x"}, {"role": "assistant", "content": probe}], tools)
    return f"<think>\n{probe}" in text


def template_keeps_shots(fmt: ChatFormat, tokenizer: Any, tools: list[dict[str, Any]], system: str, shots: list[tuple[str, str]]) -> bool:
    """Whether the chat template renders each few-shot answer whole (its thinking, calls and
    results) as an earlier assistant turn. Qwen3's keeps only what follows `</think>` of turns
    before the last user message, so the examples would teach a bare answer."""
    if not shots:
        return True
    text = fmt.render(tokenizer, build_messages("x", shots, system), tools, add_generation_prompt=True)
    return all(answer.strip() in text for _, answer in shots)


def tool_response_text(result: dict[str, Any]) -> str:
    """The text the environment inserts after a `</tool_call>`; masked in the record."""
    return "\n<tool_response>\n" + json.dumps(result, ensure_ascii=False) + "\n</tool_response>\n"


def solved_text(thought: str, name: str, arguments: dict[str, Any], result: dict[str, Any], answer: str) -> str:
    """One assistant turn that thinks, calls one tool, reads its result and answers."""
    return (
        f"<think>\n{thought}\n{tool_call_text(name, arguments)}{tool_response_text(result)}"
        f"The tool gives {answer}.\n</think>\n\nThe answer is \\boxed{{{answer}}}."
    )


# The static few-shots' parts: (thought, tool, arguments, result, answer); the results are what our
# tools return.
_SHOTS: list[tuple[str, str, dict[str, Any], dict[str, Any], str]] = [
    ("I will compute (2 + 3) * 4.", "calculator", {"expr": "(2 + 3) * 4"}, {"value": 20}, "20"),
    ("I will add the squares with Python.", "python_interpreter", {"code": "print(sum(k * k for k in (1, 2, 3)))"},
     {"stdout": "14\n", "stderr": "", "exit_code": 0}, "14"),
]

# Static few-shot examples: (user, assistant), in the Hermes format.
FEW_SHOTS: list[tuple[str, str]] = [
    (user, solved_text(*shot))
    for user, shot in zip(("What is (2 + 3) * 4?", "What is the sum of the squares of 1, 2 and 3?"), _SHOTS)
]


def build_messages(
    problem: str,
    few_shots: list[tuple[str, str]],
    system_prompt: str = SYSTEM_PROMPT,
    shots_in_system: bool = False,
) -> list[dict[str, str]]:
    """System prompt, few-shot (user, assistant) pairs in order, then the problem. With
    `shots_in_system` the pairs are text at the end of the system prompt instead of turns (for a
    template that drops what earlier assistant turns hold)."""
    if shots_in_system and few_shots:
        examples = "\n\n".join(f"Example {n}.\nProblem: {user}\nYour whole answer: {assistant}" for n, (user, assistant) in enumerate(few_shots, 1))
        return [{"role": "system", "content": f"{system_prompt}\n\n{EXAMPLES_HEADING}\n\n{examples}"}, {"role": "user", "content": problem}]
    messages = [{"role": "system", "content": system_prompt}]
    for user, assistant in few_shots:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    messages.append({"role": "user", "content": problem})
    return messages


# What introduces the few-shots where they are part of the system prompt.
EXAMPLES_HEADING = "Examples of the whole protocol, each a problem and your whole answer to it (thinking, tool calls, their results, the answer):"
