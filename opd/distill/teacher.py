"""Teacher scoring: the same model, given the hint, scores the student's own sampled tokens.

The teacher's prompt is the student's: the record's own ids before the turn (every earlier turn
exactly as sampled, every tool result exactly as inserted), with the hint put in where
`hint_placement` says, in the chat template's words (`teacher_prompt_ids`). Earlier turns are
never re-rendered: the policy's text would be tokenized again with the tokenizer's special tokens
parsed, so a `<|im_start|>` or `<|eot_id|>` it wrote as text would become a control token and the
teacher would score a conversation that never happened (and a template that re-renders history,
Qwen3's dropping earlier reasoning, gpt-oss's its analysis channel, would show another one).
It is followed by the exact ids the student sampled in that turn, and one prompt-logprob request
returns the teacher's top-K at every position. Row i of the turn is the teacher's distribution
for the student's i-th token, so the rows land on the student's tokens by construction.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from opd.agent.chat_tokens import TemplateMismatch, content_spans, encode_with_text_spans, render_ids
from opd.serving.vllm_client import PromptScores

# The reference's header above the hint in the teacher's context (env.opd.hint_header).
HINT_HEADER = "[user's hint / instruction]"

# (input_ids, top_k, rows_from) -> the prompt's rows (`opd.serving.vllm_client.PromptScores`);
# rows before `rows_from` may come back empty.
ScoreFn = Callable[[list[int], int, int], Awaitable[PromptScores]]


@dataclass(frozen=True)
class TeacherRows:
    """Per student position of the turn: top-K ids and logprobs, and the sampled token's logprob."""

    token_ids: list[list[int]]
    logprobs: list[list[float]]
    sampled_logprobs: list[float | None]


def with_hint(context: list[dict[str, Any]], hint: str, placement: str, header: str = HINT_HEADER) -> list[dict[str, Any]]:
    """The context with the hint added: appended to the last user message (`last_user`, the
    reference's choice), to the system message (`system`), or as a new user message at the end
    (`new_user`)."""
    messages = copy.deepcopy(context)
    text = f"\n\n{header}\n{hint.strip()}"
    if placement == "new_user":
        return messages + [{"role": "user", "content": f"{header}\n{hint.strip()}"}]
    role = "system" if placement == "system" else "user"
    for message in reversed(messages):
        if message.get("role") == role:
            message["content"] = f"{message.get('content') or ''}{text}"
            return messages
    return messages + [{"role": "user", "content": f"{header}\n{hint.strip()}"}]


def teacher_prompt_ids(tokenizer: Any, context: list[dict[str, Any]], context_ids: list[int], prompt_len: int, tools: list[dict] | None,
                       hint: str, placement: str, template_kwargs: dict[str, Any] | None = None, header: str = HINT_HEADER) -> list[int]:
    """The hinted teacher's prompt for the turn that follows `context`: the record's ids of that
    context (`context_ids`, ending with the generation prompt; its first `prompt_len` are the
    rendered prompt) with the hint added where `placement` says (`with_hint`):
    - in a message of the prompt (`system`, `last_user`): that prompt rendered again with the hint,
      then the record's ids after it;
    - as a new user message (`new_user`, or where no message has the role): the record's ids
      without their generation prompt, then the template's text for that message and the
      generation prompt (what it renders before the last user message comes with it: Mistral's
      tools and system prompt).
    Before the first turn the context is the prompt alone, rendered with the hint.
    The hint, like any text, is tokenized as text (`render_ids`)."""
    extra = dict(template_kwargs or {})
    hinted = with_hint(context, hint, placement, header)
    first_turn = next((i for i, m in enumerate(context) if m.get("role") == "assistant"), len(context))
    tails = [(i, hint.strip()) for i, m in enumerate(hinted) if m.get("role") == "system" and placement == "system"][-1:]
    if first_turn == len(context):  # no turn before this one: the prompt is all there is
        return render_ids(tokenizer, hinted, tools, True, extra, tails)
    if len(hinted) == len(context):
        changed = next(i for i, (a, b) in enumerate(zip(context, hinted)) if a != b)
        if changed >= first_turn:
            raise TemplateMismatch(f"the hint goes into message {changed} ({placement}), after an assistant turn: only a message of the prompt or a new one can take it")
        return render_ids(tokenizer, hinted[:first_turn], tools, True, extra, tails) + list(context_ids[prompt_len:])

    def render(messages: list[dict[str, Any]], generation: bool = True) -> str:
        return tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=generation, tokenize=False, **extra)

    before, prompted, after = render(context, False), render(context), render(hinted)
    generation = prompted[len(before):]
    if not prompted.startswith(before) or not after.endswith(generation):
        raise TemplateMismatch("the chat template's generation prompt is not the end of the rendered conversation")
    ((start, end),) = content_spans(render, hinted, [len(hinted) - 1])
    tail = before[-32:]
    found = after.rfind(tail, 0, start)
    if found < 0:
        raise TemplateMismatch("the chat template renders the conversation differently once the hint's message follows")
    cut = found + len(tail)
    generation_ids = tokenizer.encode(generation, add_special_tokens=False) if generation else []
    kept = len(context_ids) - len(generation_ids)
    if list(context_ids[kept:]) != generation_ids:
        raise TemplateMismatch("the record's context does not end with the chat template's generation prompt")
    return list(context_ids[:kept]) + encode_with_text_spans(tokenizer, after[cut:], [(start - cut, end - cut)])


async def score_turn(tokenizer: Any, context: list[dict[str, Any]], tools: list[dict] | None, turn_ids: list[int], hint: str, placement: str, top_k: int, score: ScoreFn,
                     template_kwargs: dict[str, Any] | None = None, header: str = HINT_HEADER, *, context_ids: list[int], prompt_len: int) -> TeacherRows:
    """The hinted teacher's rows on `turn_ids`: the record's ids before the turn (`context_ids`,
    the first `prompt_len` of them the rendered prompt) with the hint (`teacher_prompt_ids`), then
    the student's exact ids."""
    prompt_ids = teacher_prompt_ids(tokenizer, context, context_ids, prompt_len, tools, hint, placement, template_kwargs, header)
    first = len(prompt_ids)
    result = await score(prompt_ids + list(turn_ids), top_k, first)
    ids, lps, sampled = result.top_ids[first:], result.top_logprobs[first:], result.token_logprobs[first:]
    if len(ids) != len(turn_ids) or any(len(row) != top_k for row in ids):
        raise ValueError(f"teacher rows do not cover the turn: {len(ids)} rows for {len(turn_ids)} tokens, K={top_k}")
    return TeacherRows(ids, lps, sampled)
