"""Extract `\\boxed{...}` answers from model text, with nested braces."""

from __future__ import annotations

_MARKER = "\\boxed"


def boxed_contents(text: str, max_chars: int = 10_000) -> list[str]:
    """All `\\boxed{...}` contents in `text`, in order; unbalanced ones are skipped.

    Braces nest (`\\boxed{\\tfrac{1}{3}}` gives `\\tfrac{1}{3}`) and `\\{`/`\\}` escapes do not
    count. Linear in `len(text)`; only the first `max_chars` characters are read.
    """
    text = text[:max_chars]
    found: list[str] = []
    start = text.find(_MARKER)
    while start != -1:
        i = start + len(_MARKER)
        while i < len(text) and text[i] == " ":
            i += 1
        end = _matching_brace(text, i) if i < len(text) and text[i] == "{" else -1
        if end != -1:
            found.append(text[i + 1 : end].strip())
            start = text.find(_MARKER, end + 1)
        else:
            start = text.find(_MARKER, start + len(_MARKER))
    return found


def _matching_brace(text: str, open_at: int) -> int:
    depth = 0
    i = open_at
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def final_answer(text: str, after: str | None = "</think>") -> str | None:
    """The last boxed answer that follows the first `after` marker (None if absent)."""
    if after is not None:
        pos = text.find(after)
        if pos == -1:
            return None
        text = text[pos + len(after) :]
    answers = boxed_contents(text)
    return answers[-1] if answers else None
