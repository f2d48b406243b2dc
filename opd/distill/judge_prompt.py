"""The hindsight judge's prompt and the parser of its verdicts.

The judge reads one assistant turn and the state that followed it (tool results or a user reply)
and answers `\\boxed{1}` (the next state holds hindsight that would have improved the turn) with a
hint between `[HINT_START]` and `[HINT_END]`, or `\\boxed{-1}` without a hint.

The turn and the state are the policy's text (and what its tools printed): the markers in them are
neutralised before they are quoted (`quote_markers`), so a judge that echoes its prompt cannot
hand the parser a decision or a hint the policy wrote. The parser reads only the judge's final
answer: the text after its thinking, one decision (an answer that holds both is no vote), and the
hint that follows that decision.
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

HINT_START, HINT_END = "[HINT_START]", "[HINT_END]"
_DECISION = re.compile(r"\\boxed\{\s*(-?1)\s*\}")
# What quoted text may not carry, in any case or spacing a lenient reader might accept.
_QUOTED_BOX = re.compile(r"\\(\s*)boxed", re.IGNORECASE)
_QUOTED_HINT = re.compile(r"\[\s*hint[\s_-]*(start|end)\s*\]", re.IGNORECASE)
# The end of a thinking block: the answer is what follows the last one.
THINK_END = "</think>"
THINK_START = "<think>"


def quote_markers(text: str) -> str:
    """`text` with every verdict and hint marker made inert (`\\quotedboxed`, `[QUOTED_HINT_START]`),
    still readable as what it was."""
    text = _QUOTED_BOX.sub(r"\\\1quotedboxed", text)
    return _QUOTED_HINT.sub(lambda m: f"[QUOTED_HINT_{m.group(1).upper()}]", text)


def quoted_hints(text: str) -> set[str]:
    """The texts between hint markers in `text` (before quoting; any case or spacing, each start to
    the next end, as `parse_vote` reads a block): hints the policy planted."""
    found, start = set(), None
    for marker in _QUOTED_HINT.finditer(text):  # blocks as `parse_vote` reads them: a start, the next end
        if marker.group(1).lower() == "start":
            start = marker.end() if start is None else start
        elif start is not None:
            found.add(text[start:marker.start()].strip())
            start = None
    return found


def judge_messages(response_text: str, next_state_text: str, next_state_role: str, system_prompt: str = SYSTEM_PROMPT) -> list[dict[str, str]]:
    """The judge's chat: the system prompt, then the turn and the next state, markers neutralised."""
    user = (
        f"## Assistant turn t\n{quote_markers(response_text)}\n\n"
        f"## Next state t+1 (role: {next_state_role})\n{quote_markers(next_state_text)}\n\n"
        "Give your decision and, if it is 1, the hint."
    )
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": user}]


@dataclass(frozen=True)
class Vote:
    """One judge answer: decision 1, -1, or None when unparseable; the hint ('' if none)."""

    decision: int | None
    hint: str


def final_answer(text: str) -> str | None:
    """What follows the judge's thinking: the text after the last `</think>`; all of it when it
    never thought; None when a thinking block is still open (it never answered)."""
    end = text.rfind(THINK_END)
    if end >= 0:
        return text[end + len(THINK_END):]
    return None if THINK_START in text else text


def parse_vote(text: str, max_chars: int = 20_000) -> Vote:
    """The judge's own verdict in `text`, in one linear pass; never raises.

    Only the final answer counts (`final_answer`, its last `max_chars` characters). Its decision
    is its `\\boxed{1}` or `\\boxed{-1}`; both in one answer is no decision. The hint is the one
    `[HINT_START]..[HINT_END]` block after the first decision (none when several differ)."""
    answer = final_answer(text)
    if answer is None:
        return Vote(None, "")
    answer = answer[-max_chars:]
    decisions = list(_DECISION.finditer(answer))
    if not decisions or len({m.group(1) for m in decisions}) > 1:
        return Vote(None, "")
    hints = set()
    at = decisions[0].end()
    while (start := answer.find(HINT_START, at)) >= 0:
        end = answer.find(HINT_END, start + len(HINT_START))
        if end < 0:
            break
        hints.add(answer[start + len(HINT_START):end].strip())
        at = end + len(HINT_END)
    return Vote(int(decisions[0].group(1)), hints.pop() if len(hints) == 1 else "")
