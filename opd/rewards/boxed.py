"""Extract `\\boxed{...}` answers from model text, with nested braces."""

from __future__ import annotations

_MARKER = "\\boxed"


def boxed_contents(text: str, max_chars: int = 10_000) -> list[str]:
    """All `\\boxed{...}` contents in `text`, in order; unbalanced ones are skipped.

    Braces nest (`\\boxed{\\tfrac{1}{3}}` gives `\\tfrac{1}{3}`) and `\\{`/`\\}` escapes do not
    count; a box inside another box is part of the outer one. One pass over the first
    `max_chars` characters with a stack of open braces, so linear even for hostile input.
    """
    text = text[:max_chars]
    stack: list[tuple[int, bool]] = []  # (index of "{", opened by \boxed)
    spans: list[tuple[int, int]] = []
    i, n = 0, len(text)
    while i < n:
        if text.startswith(_MARKER, i):
            j = i + len(_MARKER)
            while j < n and text[j] == " ":
                j += 1
            if j < n and text[j] == "{":
                stack.append((j, True))
                j += 1
            i = j
            continue
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if char == "{":
            stack.append((i, False))
        elif char == "}" and stack:
            opened, boxed = stack.pop()
            if boxed:
                spans.append((opened, i))
        i += 1
    found: list[str] = []
    last_end = -1
    for opened, closed in sorted(spans):
        if opened > last_end:  # not inside a box already taken
            found.append(text[opened + 1 : closed].strip())
            last_end = closed
    return found


def final_answer(text: str, after: str | None = "</think>") -> str | None:
    """The last boxed answer that follows the first `after` marker (None if absent)."""
    if after is not None:
        pos = text.find(after)
        if pos == -1:
            return None
        text = text[pos + len(after) :]
    answers = boxed_contents(text)
    return answers[-1] if answers else None
