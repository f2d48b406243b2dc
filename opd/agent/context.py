"""What the model's context has left: text the environment inserts is cut to fit it.

A tool's output goes into the sequence between two assistant turns (opd_coding) or inside one
(inline_math), and whatever it holds (20,000 rare characters are 60,000-80,000 tokens for the real
tokenizers), the sequence must never pass the server's `max_model_len`: a trainer or atroposlib
(`max_token_length`) cannot take it. So before text is inserted, its ids are measured against the
room left; an output that would leave the next generation fewer than `NEXT_TURN_MIN` tokens (or
its whole budget, when that is smaller) is cut, and the cut output says so (`cut_note`). When not
even an emptied output fits, nothing is inserted and the rollout ends with `finish: context`.

The cut is found by measuring the real ids (the template's rendering, the text tokenized as the
environment tokenizes it), a few renders at most: token counts grow with the characters kept, so
each guess interpolates between the longest cut known to fit and the shortest known not to.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from opd.agent.chat_tokens import continuation_ids

# Tokens a cut output leaves the next generation, at least (its whole budget when smaller).
NEXT_TURN_MIN = 256
# Renders tried to find the longest cut that fits (each one a template render and a tokenization).
MAX_TRIES = 12


def cut_note(shown: int, total: int) -> str:
    """What a cut output ends with: how much of it the model sees, and why."""
    return f"\n[output cut to {shown:,} of {total:,} characters: the model's context has no room for more]"


def cut_text(text: str, chars: int | None) -> str:
    """`text` cut to its first `chars` characters plus the note (whole when it is not longer)."""
    if chars is None or len(text) <= chars:
        return text
    return text[:chars] + cut_note(chars, len(text))


def room_for_insert(max_model_len: int, sequence_len: int, next_budget: int) -> int:
    """Tokens an insertion may take so that the next generation keeps `NEXT_TURN_MIN` tokens (or
    `next_budget` when smaller)."""
    return max_model_len - sequence_len - max(1, min(next_budget, NEXT_TURN_MIN))


def fit_texts(measure: Callable[[list[str]], int], texts: list[str], room: int) -> list[str] | None:
    """`texts` as inserted: whole when `measure(texts)` (the ids they make) is at most `room`; else
    each cut to one common length (`cut_text`), the longest found that fits; None when not even
    emptied ones fit."""
    whole = measure(texts)
    if whole <= room:
        return texts
    longest = max(len(t) for t in texts)

    def cut(chars: int) -> list[str]:
        return [cut_text(t, chars) for t in texts]

    fit_chars, fit_len = 0, measure(cut(0))
    if fit_len > room:
        return None
    over_chars, over_len = longest, whole
    for _ in range(MAX_TRIES):
        if over_chars - fit_chars <= 1 or room - fit_len <= max(8, room // 200):
            break
        # Interpolate (token counts grow about linearly with the characters kept), always strictly between.
        guess = fit_chars + int((over_chars - fit_chars) * (room - fit_len) / max(1, over_len - fit_len))
        guess = min(max(guess, fit_chars + 1), over_chars - 1)
        length = measure(cut(guess))
        if length <= room:
            fit_chars, fit_len = guess, length
        else:
            over_chars, over_len = guess, length
    return cut(fit_chars)


def fit_tool_results(tokenizer: Any, history: list[dict[str, Any]], results: list[dict[str, Any]], tools: list[dict] | None,
                     template_kwargs: Mapping[str, Any] | None, end_token: str | None, room: int) -> list[int] | None:
    """The ids that continue `history` with the tool messages `results` (`continuation_ids`),
    within `room` tokens: each result's content cut as `fit_texts` does (in place: the messages
    then hold what the model saw); None when not even emptied results fit."""
    contents = [str(m.get("content", "")) for m in results]
    rendered: dict[tuple[str, ...], list[int]] = {}

    def measure(texts: list[str]) -> int:
        ids = continuation_ids(tokenizer, history, [{**m, "content": t} for m, t in zip(results, texts)], tools, template_kwargs, end_token)
        rendered[tuple(texts)] = ids
        return len(ids)

    kept = fit_texts(measure, contents, room)
    if kept is None:
        return None
    for message, text in zip(results, kept):
        message["content"] = text
    return rendered[tuple(kept)]


def fit_result(ids_for: Callable[[Any], list[int]], result: Any, room: int) -> tuple[Any, list[int]] | None:
    """A tool's JSON result (`ids_for(result)`: its ids as inserted) and those ids, within `room`
    tokens: every string in it cut as `fit_texts` does; None when not even emptied strings fit."""
    texts: list[str] = []
    _strings(result, texts.append)
    rendered: dict[tuple[str, ...], tuple[Any, list[int]]] = {}

    def measure(cut: list[str]) -> int:
        replaced = iter(cut)
        value = _strings(result, lambda _: next(replaced))
        ids = ids_for(value)
        rendered[tuple(cut)] = (value, ids)
        return len(ids)

    if not texts:  # nothing to cut: numbers only
        ids = ids_for(result)
        return (result, ids) if len(ids) <= room else None
    kept = fit_texts(measure, texts, room)
    return None if kept is None else rendered[tuple(kept)]


def _strings(value: Any, visit: Callable[[str], Any]) -> Any:
    """`value` with each string in it (dict values, list items, in order) replaced by `visit(it)`."""
    if isinstance(value, str):
        return visit(value)
    if isinstance(value, dict):
        return {k: _strings(v, visit) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strings(v, visit) for v in value]
    return value
