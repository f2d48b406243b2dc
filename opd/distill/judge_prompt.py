"""The hindsight judge's prompt and the parser of its verdicts.

The judge reads one assistant turn and the state that followed it (tool results or a user reply)
and answers `\\boxed{1}` (the next state holds hindsight that would have improved the turn) with a
hint between `[HINT_START]` and `[HINT_END]`, or `\\boxed{-1}` without a hint.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SYSTEM_PROMPT = (
    "You judge one step of an agent. You see the assistant's turn t and the next state at turn t+1 "
    "with its role. role=tool: the output of a tool the assistant called; it exists because the assistant "
    "acted, and a clean, successful result means the action was fine. role=user: a reply from the user.\n"
    "Decide whether the next state reveals hindsight that would have improved turn t.\n"
    "Answer with exactly one decision, \\boxed{1} or \\boxed{-1}. Only after \\boxed{1}, give a concrete "
    "hint of 1-3 sentences between [HINT_START] and [HINT_END]."
)

_DECISION = re.compile(r"\\boxed\{\s*(-?1)\s*\}")
_HINT = re.compile(r"\[HINT_START\](.*?)\[HINT_END\]", re.DOTALL)


def judge_messages(response_text: str, next_state_text: str, next_state_role: str, system_prompt: str = SYSTEM_PROMPT) -> list[dict[str, str]]:
    user = (
        f"## Assistant turn t\n{response_text}\n\n"
        f"## Next state t+1 (role: {next_state_role})\n{next_state_text}\n\n"
        "Give your decision and, if it is 1, the hint."
    )
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": user}]


@dataclass(frozen=True)
class Vote:
    """One judge answer: decision 1, -1, or None when unparseable; the hint ('' if none)."""

    decision: int | None
    hint: str


def parse_vote(text: str, max_chars: int = 20_000) -> Vote:
    """The last boxed decision and the last hint block; never raises."""
    text = text[:max_chars]
    decisions = _DECISION.findall(text)
    decision = int(decisions[-1]) if decisions else None
    hints = _HINT.findall(text)
    return Vote(decision, hints[-1].strip() if hints else "")
