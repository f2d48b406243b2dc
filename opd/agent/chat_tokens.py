"""Token-exact multi-turn chat: the ids to insert between assistant turns.

A multi-turn rollout keeps the ids the server sampled for every assistant turn, including the
end-of-turn token it sampled. What comes next (tool results, a user reply, and the next
generation prompt) is rendered by the model's own chat template and cut right after that
end-of-turn token, so no end-of-turn token is ever duplicated and no earlier turn is
re-tokenised. The cut is at a special token, so BPE never merges across it.
"""

from __future__ import annotations

from typing import Any, Mapping


class TemplateMismatch(ValueError):
    """The chat template rendered the history differently with and without the new messages."""


def continuation_text(tokenizer: Any, history: list[dict[str, Any]], new_messages: list[dict[str, Any]], tools: list[dict] | None,
                      template_kwargs: Mapping[str, Any] | None = None) -> str:
    """Template text after the last end-of-turn token of `history` (which ends with an assistant
    message) up to and including the generation prompt for the next assistant turn
    (`template_kwargs`: the model preset's chat-template arguments)."""
    eos = tokenizer.eos_token
    extra = dict(template_kwargs or {})
    before = tokenizer.apply_chat_template(history, tools=tools, tokenize=False, **extra)
    after = tokenizer.apply_chat_template(history + new_messages, tools=tools, add_generation_prompt=True, tokenize=False, **extra)
    cut = before.rfind(eos)
    if cut == -1:
        raise TemplateMismatch(f"the rendered history has no end-of-turn token {eos!r}")
    cut += len(eos)
    if after[:cut] != before[:cut]:
        raise TemplateMismatch("the chat template renders earlier turns differently once new messages follow")
    return after[cut:]


def continuation_ids(tokenizer: Any, history: list[dict[str, Any]], new_messages: list[dict[str, Any]], tools: list[dict] | None,
                     template_kwargs: Mapping[str, Any] | None = None) -> list[int]:
    return tokenizer.encode(continuation_text(tokenizer, history, new_messages, tools, template_kwargs), add_special_tokens=False)
