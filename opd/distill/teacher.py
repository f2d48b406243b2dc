"""Teacher scoring: the same model, given the hint, scores the student's own sampled tokens.

The hinted context (rendered by the chat template, with the generation prompt) is followed by
the exact ids the student sampled in that turn, and one prompt-logprob request returns the
teacher's top-K at every position. Row i of the turn is the teacher's distribution for the
student's i-th token, so the rows land on the student's tokens by construction.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from opd.agent.chat_tokens import render_ids
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


async def score_turn(tokenizer: Any, context: list[dict[str, Any]], tools: list[dict] | None, turn_ids: list[int], hint: str, placement: str, top_k: int, score: ScoreFn,
                     template_kwargs: dict[str, Any] | None = None, header: str = HINT_HEADER) -> TeacherRows:
    """The hinted teacher's rows on `turn_ids`: the context with the hint, rendered by the chat
    template (with the rollout's template arguments), then the student's exact ids."""
    # The hint, the task and the tool results are text: none of them can forge a control token.
    hinted = with_hint(context, hint, placement, header)
    system = [(i, hint.strip()) for i, m in enumerate(hinted) if m.get("role") == "system" and placement == "system"]
    prompt_ids = render_ids(tokenizer, hinted, tools, True, template_kwargs, system[-1:])
    first = len(prompt_ids)
    result = await score(prompt_ids + list(turn_ids), top_k, first)
    ids, lps, sampled = result.top_ids[first:], result.top_logprobs[first:], result.token_logprobs[first:]
    if len(ids) != len(turn_ids) or any(len(row) != top_k for row in ids):
        raise ValueError(f"teacher rows do not cover the turn: {len(ids)} rows for {len(turn_ids)} tokens, K={top_k}")
    return TeacherRows(ids, lps, sampled)
