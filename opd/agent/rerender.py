"""One rollout's record against the chat template's rendering of its conversation.

A record keeps the ids the model sampled and, between them, what the environment inserted: the
prompt, tool results, the next generation prompt. `rerender` renders the record's conversation
(its `messages`) with the model's chat template, as the environment would have, and reports
where the ids differ:

- `prompt`, `inserted k`: the prompt, or the k-th inserted stretch, is not the template's
  rendering (with tool output and other inserted text tokenized as text). These are errors: the
  model was shown something its template does not produce.
- `turn k`: the template re-renders the k-th sampled turn otherwise than it was sampled (Qwen3
  drops earlier reasoning, gpt-oss reorders a call's header and drops analysis, Mistral adds the
  call's id, Llama ends a call with `<|eot_id|>` where the model may end it with `<|eom_id|>`).
  Records keep the sampled ids by design; these are notes.

Two shapes of conversation are understood. Message by message (opd_coding, and inline_math where
a call ends the message): each sampled stretch is one assistant message, and what follows it is
checked against the template's continuation after that turn. One assistant turn with tool
results inside it (inline_math in the Hermes formats): the whole conversation is rendered once and
the record compared with it, the results' JSON tokenized as text.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from typing import Any

from opd.agent.chat_format import ChatFormat
from opd.agent.chat_tokens import TemplateMismatch, continuation_ids, continuation_text, encode_with_text_spans, holds_added_token
from opd.records import MASK


@dataclass(frozen=True)
class Difference:
    """Where a record's ids differ from the template's rendering of its conversation."""

    where: str  # "prompt", "inserted k", "turn k" (k from 1), or "conversation"
    start: int  # the first position in the record's tokens it covers
    got: tuple[int, ...]  # the record's ids there (from a few ids before it, when they are the same)
    expected: tuple[int, ...]  # the template's ids there
    error: bool  # False: a sampled turn the template re-renders otherwise (a note)
    why: str = ""

    def describe(self, tokenizer: Any) -> str:
        """One line: where, at which position, the record's text against the template's."""
        def shown(ids: tuple[int, ...]) -> str:
            text = tokenizer.decode(list(ids), skip_special_tokens=False)
            return repr(text if len(text) <= 160 else text[:80] + " ... " + text[-60:])

        if self.why and (self.got == self.expected):
            return f"{self.where} at token {self.start}: {self.why}"
        what = "the template re-renders it otherwise" if not self.error else "not the template's rendering"
        return f"{self.where} at token {self.start}: {what}: record {shown(self.got)}, template {shown(self.expected)}" + (f" ({self.why})" if self.why else "")


def segments(masks: list[int]) -> list[tuple[str, int, int]]:
    """The record's stretches in order: ("prompt" | "sampled" | "inserted", start, end)."""
    out: list[tuple[str, int, int]] = []
    start = 0
    for position in range(1, len(masks) + 1):
        if position == len(masks) or (masks[position] == MASK) != (masks[start] == MASK):
            kind = "sampled" if masks[start] != MASK else ("prompt" if not out else "inserted")
            out.append((kind, start, position))
            start = position
    return out


def rerender(tokenizer: Any, fmt: ChatFormat, tools: list[dict] | None, messages: list[dict[str, Any]], tokens: list[int],
             masks: list[int], json_results: bool = False) -> list[Difference]:
    """The differences between one rollout's ids and the template's rendering of its
    conversation (see the module docstring); [] when the record is the template's rendering.
    `json_results`: tool messages hold a JSON object's text, which the template is given as the
    object (inline_math's results; a template then writes it as the JSON itself)."""
    parts = segments(list(masks))
    if not parts or parts[0][0] != "prompt":
        return [Difference("conversation", 0, (), (), True, "the record has no prompt")]
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    if not users:
        return [Difference("conversation", 0, (), (), True, "the conversation has no user message")]
    prompt_messages, after = messages[: users[-1] + 1], [_for_template(m, json_results) for m in messages[users[-1] + 1:]]
    found: list[Difference] = []
    _, _, prompt_end = parts[0]
    expected = fmt.render_ids(tokenizer, prompt_messages, tools, add_generation_prompt=True)
    text = fmt.render(tokenizer, prompt_messages, tools, add_generation_prompt=True)
    found += _compare(tokenizer, "prompt", 0, tokens[:prompt_end], expected, text)
    sampled = [p for p in parts if p[0] == "sampled"]
    assistants = [i for i, m in enumerate(after) if m.get("role") == "assistant"]
    if len(after) == 1 and assistants == [0] and any(p[0] == "inserted" for p in parts):
        whole_errors = True  # one turn with results inside: only the whole rendering says what they should be
    elif len(assistants) == len(sampled):
        found += _by_message(tokenizer, fmt, tools, prompt_messages, after, assistants, parts, tokens, json_results)
        whole_errors = False
    else:
        return found + [Difference("conversation", prompt_end, (), (), True,
                                   f"{len(assistants)} assistant messages for {len(sampled)} sampled stretches: not this record's conversation")]
    full = [*prompt_messages, *after]
    try:
        text = fmt.render(tokenizer, full, tools)
        spans = _text_spans(tokenizer, fmt, text, full, parts if whole_errors else [], tokens, json_results)
        expected = encode_with_text_spans(tokenizer, text, spans)
    except (TemplateMismatch, ValueError, TypeError) as err:
        return found + [Difference("conversation", prompt_end, (), (), True, f"the template cannot render the conversation: {err}")]
    # Message by message, the inserted stretches were compared above: what the whole rendering
    # adds is where it renders the sampled turns otherwise.
    return found + [d for d in _whole(parts, tokens, expected, whole_errors) if whole_errors or d.where.startswith("turn")]


def _for_template(message: dict[str, Any], json_results: bool) -> dict[str, Any]:
    """A recorded message as the template takes it (a JSON result as its object)."""
    if json_results and message.get("role") == "tool" and isinstance(message.get("content"), str):
        try:
            return {**message, "content": json.loads(message["content"])}
        except ValueError:
            return message
    return message


def _by_message(tokenizer: Any, fmt: ChatFormat, tools: list[dict] | None, prompt: list[dict[str, Any]], after: list[dict[str, Any]],
                assistants: list[int], parts: list[tuple[str, int, int]], tokens: list[int], json_results: bool) -> list[Difference]:
    """Each inserted stretch against the template's continuation after the turn before it."""
    found: list[Difference] = []
    turn = 0
    for index, (kind, start, end) in enumerate(parts):
        if kind != "sampled":
            continue
        turn += 1
        if index + 1 >= len(parts) or parts[index + 1][0] != "inserted":
            continue
        _, inserted_start, inserted_end = parts[index + 1]
        at = assistants[turn - 1]
        following = after[at + 1: assistants[turn] if turn < len(assistants) else len(after)]
        history = [*prompt, *after[: at + 1]]
        end_token = tokenizer.convert_ids_to_tokens(tokens[end - 1])
        try:
            text = continuation_text(tokenizer, history, following, tools, fmt.render_kwargs, end_token)
            expected = _continuation(tokenizer, fmt, tools, history, following, end_token, json_results, text)
        except (TemplateMismatch, ValueError, TypeError) as err:
            found.append(Difference(f"inserted {turn}", inserted_start, (), (), True, f"the template cannot continue after turn {turn}: {err}"))
            continue
        found += _compare(tokenizer, f"inserted {turn}", inserted_start, tokens[inserted_start:inserted_end], expected, text)
    return found


def _continuation(tokenizer: Any, fmt: ChatFormat, tools: list[dict] | None, history: list[dict[str, Any]], following: list[dict[str, Any]],
                  end_token: str, json_results: bool, text: str) -> list[int]:
    """The template's ids after a turn, what the new messages hold tokenized as text: as the agent
    inserts them (`continuation_ids`); a JSON result, which the template writes as the JSON
    itself, found by its text."""
    if not json_results:
        return continuation_ids(tokenizer, history, following, tools, fmt.render_kwargs, end_token)
    spans, at = [], 0
    for message in following:
        content = message.get("content")
        shown = json.dumps(content, ensure_ascii=False) if not isinstance(content, str) else _as_rendered(content, text)
        where = text.find(shown, at) if shown else -1
        if where != -1:
            if holds_added_token(tokenizer, shown):
                spans.append((where, where + len(shown)))
            at = where + len(shown)
    return encode_with_text_spans(tokenizer, text, spans)


def _as_rendered(content: str, text: str) -> str:
    """How a template wrote `content` into `text`: as it is, or as a JSON string's inside
    (templates that `tojson` a tool's text, as Llama's, gpt-oss's and the Mistral one do)."""
    return content if content in text else json.dumps(content, ensure_ascii=False)[1:-1]


def _text_spans(tokenizer: Any, fmt: ChatFormat, text: str, messages: list[dict[str, Any]], parts: list[tuple[str, int, int]],
                tokens: list[int], json_results: bool) -> list[tuple[int, int]]:
    """Where the whole rendering holds text that is text, not markers: user and tool contents,
    then the results inserted inside the assistant turn (`parts`' inserted stretches), each found
    in order by its text where it holds an added token's text."""
    pieces: list[Any] = []
    for message in messages:
        content = message.get("content")
        if message.get("role") in ("user", "tool"):
            pieces.append(json.dumps(content, ensure_ascii=False) if json_results and not isinstance(content, str) else content)
    for kind, start, end in parts:
        if kind == "inserted":
            values = fmt.response_values(tokenizer.decode(tokens[start:end], skip_special_tokens=False))
            if values is not None:
                pieces.append(values["result"])
    spans: list[tuple[int, int]] = []
    at = 0
    for piece in pieces:
        if not isinstance(piece, str) or not piece:
            continue
        shown = _as_rendered(piece, text)
        where = text.find(shown, at)
        if where == -1:
            continue
        if holds_added_token(tokenizer, piece):
            spans.append((where, where + len(shown)))
        at = where + len(shown)
    return spans


def _compare(tokenizer: Any, where: str, offset: int, got: list[int], expected: list[int], text: str) -> list[Difference]:
    """The record's ids of one stretch against the template's; where they are the same, their
    text against the template's text too (a record and a check that tokenized alike, but wrongly,
    still decode to text the template never wrote: a space a tool never printed)."""
    if list(got) == list(expected):
        decoded = tokenizer.decode(list(got), skip_special_tokens=False)
        if decoded == text:
            return []
        first = next((i for i, (a, b) in enumerate(zip(decoded, text)) if a != b), min(len(decoded), len(text)))
        return [Difference(where, offset, tuple(got), tuple(expected), True,
                           f"its ids decode to other text than the template's: {decoded[max(0, first - 40):first + 40]!r} "
                           f"where the template has {text[max(0, first - 40):first + 40]!r}")]
    first = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
    shown = max(0, first - 4)  # a few equal ids before it, to show where it is
    return [Difference(where, offset + first, tuple(got[shown:first + 24]), tuple(expected[shown:first + 24]), True)]


def _whole(parts: list[tuple[str, int, int]], tokens: list[int], expected: list[int], errors: bool) -> list[Difference]:
    """The record against the whole rendering: each stretch that differs, named by the record's
    stretch it lies in (an error in the prompt or an inserted stretch when `errors`; a note in a
    sampled turn). The template's text after the record's last id (the end of the last turn as
    it renders it) is not compared."""
    found: list[Difference] = []
    names = _names(parts)
    matcher = difflib.SequenceMatcher(None, tokens, expected, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal" or (tag == "insert" and i1 == len(tokens)):
            continue
        covered = range(i1, i2) if i2 > i1 else [p for p in (i1 - 1, i1) if 0 <= p < len(tokens)]
        kinds = [names[p] for p in covered]
        inside_turn = any(name.startswith("turn") for name in kinds)
        where = kinds[0] if kinds else "conversation"
        found.append(Difference(where, i1, tuple(tokens[i1:i2][:24]), tuple(expected[j1:j2][:24]), errors and not inside_turn))
    return found


def _names(parts: list[tuple[str, int, int]]) -> list[str]:
    """Each position's stretch: "prompt", "turn k" or "inserted k"."""
    out: list[str] = []
    turn = 0
    for kind, start, end in parts:
        if kind == "sampled":
            turn += 1
        name = "prompt" if kind == "prompt" else f"turn {turn}" if kind == "sampled" else f"inserted {turn}"
        out += [name] * (end - start)
    return out
