"""Turn pairs: each assistant turn with the state that followed it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opd.agent.loop import AgentRollout, TurnSpan


@dataclass(frozen=True)
class TurnPair:
    """One assistant turn (its span in the sequence and its text), the context before it, and
    the next state: every tool result up to the next assistant turn, or a user reply."""

    span: TurnSpan
    context: list[dict[str, Any]]
    response_text: str
    next_state_text: str
    next_state_role: str


def _cut(text: str, limit: int | None, keep: str = "head") -> str:
    """`text` cut to `limit` characters (None: whole), keeping its start (`head`) or its end (`tail`)."""
    if limit is None or len(text) <= limit:
        return text
    if keep == "tail":
        return f"[...{len(text) - limit} characters before]\n" + text[-limit:]
    return text[:limit] + f"\n...[truncated at {limit} characters]"


def turn_pairs(rollout: AgentRollout, max_state_chars: int, max_response_chars: int | None, response_cut: str = "tail") -> list[TurnPair]:
    """Pairs for every assistant turn that has a next state (tool-call-only turns included). A
    long turn is shown to the judge by its end (`response_cut=tail`: where a thinking model's
    call is) or its start (`head`); a long next state by its start."""
    pairs = []
    messages = rollout.messages
    for span in rollout.turns:
        following = []
        for message in messages[span.message_index + 1 :]:
            if message["role"] == "tool":
                following.append(message)
                continue
            if message["role"] == "user" and not following:
                following.append(message)
            break
        if not following:
            continue
        state = "\n---\n".join(str(m.get("content", "")) for m in following)
        pairs.append(
            TurnPair(
                span=span,
                context=messages[: span.message_index],
                response_text=_cut(_turn_text(messages[span.message_index]), max_response_chars, response_cut),
                next_state_text=_cut(state, max_state_chars),
                next_state_role=following[0]["role"],
            )
        )
    return pairs


def _turn_text(message: dict[str, Any]) -> str:
    """An assistant turn as the model wrote it (a Harmony turn's sampled text, kept beside its fields)."""
    return str(message.get("sampled") or message.get("content") or "")
