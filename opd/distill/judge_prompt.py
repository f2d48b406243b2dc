"""The hindsight judge's prompt and the parser of its verdicts.

The judge reads one assistant turn and the state that followed it (tool results or a user reply)
and answers `\\boxed{1}` (the next state holds hindsight that would have improved the turn) with a
hint between `[HINT_START]` and `[HINT_END]`, or `\\boxed{-1}` without a hint.

The turn and the state are the policy's text (and what its tools printed): the markers in them
(decisions, hint markers, thinking tags) are neutralised before they are quoted (`quote_markers`),
so a judge that echoes its prompt cannot hand the parser a decision or a hint the policy wrote, nor
lose its own vote by quoting a `</think>`. Markers spelt with look-alike characters (fullwidth,
mathematical, Cyrillic or Greek letters) or with invisible ones inside (zero-width spaces, soft
hyphens) count as markers too: a judge that reads or copies them as markers would otherwise take
them. The parser reads only the judge's final answer: the text after its thinking, one decision
(an answer that holds both is no vote), and the hint that follows that decision.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

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
# The end of a thinking block: the answer is what follows the last one.
THINK_END = "</think>"
THINK_START = "<think>"

# Characters a reader does not see, besides the format characters (Unicode category Cf) found
# below: the combining grapheme joiner, Hangul fillers, variation selectors.
_INVISIBLE_EXTRA = "\u034f\u115f\u1160\u3164\uffa0" + "".join(map(chr, range(0xFE00, 0xFE10))) + "".join(map(chr, range(0xE0100, 0xE01F0)))
# Letters of other scripts that pass for an ASCII character (NFKC does not fold them).
_LOOKALIKES = {"\\": "\u2216\u29f5\u29f9", "<": "\u2039\u1438\u27e8", ">": "\u203a\u1433\u27e9", "/": "\u2215\u2044\u2571\u29f8",
               "a": "\u0430\u0251\u03b1", "b": "\u044c\u0185\u0432\u03b2\u0412\u0392", "d": "\u0501", "e": "\u0435\u04bd\u03b5\u0415\u0395",
               "h": "\u04bb\u043d\u03b7\u041d\u0397", "i": "\u0456\u0131\u0269\u03b9\u04cf\u01c0\u0406\u0399\u04c0",
               "k": "\u043a\u03ba\u0138\u041a\u039a", "n": "\u0578\u03bd\u039d", "o": "\u043e\u03bf\u0585\u1d0f\u041e\u039f",
               "r": "\u0433\u1d26\u0280", "s": "\u0455\ua731\u0405", "t": "\u0442\u03c4\u0422\u03a4", "x": "\u0445\u03c7\u00d7\u0425\u03a7"}
# Where the compatibility forms of ASCII (fullwidth, mathematical, super- and subscript, enclosed)
# and the format characters live: searched once for both (~5,000 code points).
_SEARCHED = ((0xA0, 0x300), (0x600, 0x900), (0x1800, 0x1810), (0x1D00, 0x1DC0), (0x2000, 0x2500), (0xFE00, 0x10000), (0x110BD, 0x110CE),
             (0x13430, 0x13440), (0x1BCA0, 0x1BCA4), (0x1D173, 0x1D17B), (0x1D400, 0x1D800), (0x1F100, 0x1F200), (0xE0000, 0xE0080))
# Stands for an invisible character in the folded text (`_folded`); NUL, itself invisible.
_GAP = "\x00"


@lru_cache(maxsize=1)
def _table() -> dict[int, str]:
    """str.translate table: each look-alike of an ASCII character to it, each invisible character
    to `_GAP`, one character for one (so positions in the folded text are positions in the text)."""
    table = {ord(c): ascii for ascii, chars in _LOOKALIKES.items() for c in chars}
    table.update(dict.fromkeys(map(ord, _INVISIBLE_EXTRA), _GAP))
    for low, high in _SEARCHED:
        for code in range(low, high):
            char = chr(code)
            if unicodedata.category(char) == "Cf":
                table[code] = _GAP
                continue
            folded = unicodedata.normalize("NFKC", char)
            if len(folded) == 1 and folded.isascii() and folded != char:
                table[code] = folded
    return table


def _folded(text: str) -> str:
    """`text` as a lenient reader sees it, character for character: look-alikes as the ASCII they
    pass for, invisible characters as `_GAP`."""
    return text if text.isascii() else text.translate(_table())


def _spelt(word: str) -> str:
    """A pattern for `word` in folded text, with invisible characters between its letters."""
    return f"{_GAP}*".join(re.escape(c) for c in word)


_SPACE = f"[\\s{_GAP}]*"
# What quoted text may not carry, in any case, spacing or look-alike spelling a lenient reader
# might accept (matched in the folded text): a decision, a hint marker, a thinking tag.
_MARKER = re.compile(
    f"(?P<box>{_spelt(chr(92))}{_SPACE}{_spelt('boxed')})"
    f"|(?P<hint>\\[{_SPACE}{_spelt('hint')}[\\s_\\-{_GAP}]*(?:(?P<start>{_spelt('start')})|{_spelt('end')}){_SPACE}\\])"
    f"|(?P<think><{_SPACE}(?:(?P<close>/){_SPACE})?{_spelt('think')}{_SPACE}>)",
    re.IGNORECASE,
)


def _inert(marker: re.Match[str]) -> str:
    if marker.group("box"):
        return "\\quotedboxed"
    if marker.group("hint"):
        return "[QUOTED_HINT_START]" if marker.group("start") else "[QUOTED_HINT_END]"
    return "</quoted_think>" if marker.group("close") else "<quoted_think>"


def quote_markers(text: str) -> str:
    """`text` with every verdict and hint marker and thinking tag made inert (`\\quotedboxed`,
    `[QUOTED_HINT_START]`, `<quoted_think>`), still readable as what it was."""
    out, at = [], 0
    for marker in _MARKER.finditer(_folded(text)):
        out += [text[at:marker.start()], _inert(marker)]
        at = marker.end()
    return "".join(out) + text[at:]


def same_hint(text: str) -> str:
    """`text` as a reader sees it, to compare hints: invisible characters dropped, look-alikes and
    compatibility forms folded to ASCII, case folded, spacing collapsed."""
    return " ".join(unicodedata.normalize("NFKC", _folded(text).replace(_GAP, "")).casefold().split())


def quoted_hints(text: str) -> set[str]:
    """The texts between hint markers in `text` (before quoting; any case, spacing or look-alike
    spelling, each start to the next end, as `parse_vote` reads a block), as `same_hint` gives
    them: hints the policy planted."""
    found, start = set(), None
    for marker in _MARKER.finditer(_folded(text)):  # blocks as `parse_vote` reads them: a start, the next end
        if not marker.group("hint"):
            continue
        if marker.group("start"):
            start = marker.end() if start is None else start
        elif start is not None:
            found.add(same_hint(text[start:marker.start()]))
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
