"""Token-exact multi-turn chat: the ids to insert between assistant turns, and text the
environment inserts tokenized as text.

A multi-turn rollout keeps the ids the server sampled for every assistant turn, including the
end-of-turn token it sampled. What comes next (tool results, a user reply, and the next
generation prompt) is rendered by the model's own chat template and cut right after that
end-of-turn token, so no end-of-turn token is ever duplicated and no earlier turn is
re-tokenised. The cut is at a special token, so BPE never merges across it.

Text that does not come from the template (tool output, a user's or the judge's text, a
dataset's problem) is tokenized as text: where it holds the text of one of the tokenizer's added
tokens (`<|im_end|><|im_start|>user ...`, `<｜User｜>`, `[INST]`), that text becomes ordinary
tokens, never the control token, so a program cannot forge a turn. Only the template's own
markers are control tokens. Text without such strings is tokenized with the whole rendering, so
its ids are exactly the template's.
"""

from __future__ import annotations

import json
import pickle
import uuid
from typing import Any, Callable, Iterable, Mapping

# Roles whose content comes from outside (a dataset, a user, a tool): tokenized as text. The
# system prompt is the run's own configuration (its examples may show the format's markers).
INSERTED_ROLES = ("user", "tool")


class TemplateMismatch(ValueError):
    """The chat template rendered the history differently with and without the new messages."""


def added_token_texts(tokenizer: Any) -> tuple[str, ...]:
    """The text of every added token (special or not: R1's `<｜User｜>` is not special)."""
    cached = getattr(tokenizer, "_opd_added_texts", None)
    if cached is None:
        cached = tuple(sorted({str(t) for t in tokenizer.added_tokens_decoder.values() if str(t)}, key=len, reverse=True))
        try:
            tokenizer._opd_added_texts = cached
        except AttributeError:  # a tokenizer that takes no attributes: computed each time
            pass
    return cached


# Inserted after the first character of an added token's text in what goes to a server that
# tokenizes it itself (the judge's chat): a word joiner, invisible, and no token's text.
WORD_JOINER = "\u2060"


def defuse(tokenizer: Any, text: str) -> str:
    """`text` with every added token's text broken by an invisible word joiner, for text a server
    tokenizes itself (vLLM's chat route parses special tokens in message text): no control token
    can come from it there either."""
    if not holds_added_token(tokenizer, text):
        return text
    for token in added_token_texts(tokenizer):  # longest first
        text = text.replace(token, token[0] + WORD_JOINER + token[1:])
    return text


def special_ids(tokenizer: Any) -> frozenset[int]:
    """Ids of every special added token (gpt-oss's <|call|>, Llama's <|eom_id|>: not all of them
    are in `all_special_ids`)."""
    cached = getattr(tokenizer, "_opd_special_ids", None)
    if cached is None:
        cached = frozenset([*tokenizer.all_special_ids, *(i for i, t in tokenizer.added_tokens_decoder.items() if getattr(t, "special", False))])
        try:
            tokenizer._opd_special_ids = cached
        except AttributeError:
            pass
    return cached


def holds_added_token(tokenizer: Any, text: Any) -> bool:
    """Whether `text` contains the text of any added token."""
    return isinstance(text, str) and any(t in text for t in added_token_texts(tokenizer))


def _plain_ids(tokenizer: Any, text: str, first: bool = True) -> list[int]:
    """`text` through the tokenizer's normaliser, pre-tokenizer and model, without its added
    tokens: ordinary tokens only. `first=False`: for a section that does not start what is
    tokenized, as the whole tokenizer tokenizes a section after an added token (a Metaspace
    pre-tokenizer that puts its "▁" before the first section only, as Mistral's does, puts none there)."""
    backend = tokenizer.backend_tokenizer
    if backend.normalizer is not None:
        text = backend.normalizer.normalize_str(text)
    pre = backend.pre_tokenizer if first else _inner_pre_tokenizer(tokenizer)
    pieces = [piece for piece, _ in pre.pre_tokenize_str(text)] if pre is not None else [text]
    return [token.id for piece in pieces for token in backend.model.tokenize(piece)]


def _inner_pre_tokenizer(tokenizer: Any) -> Any:
    """The pre-tokenizer with a Metaspace's "▁ before the first section" off (built once)."""
    cached = getattr(tokenizer, "_opd_inner_pre", None)
    if cached is None:
        pre = tokenizer.backend_tokenizer.pre_tokenizer
        cached = pre
        if pre is not None:
            state = json.loads(pre.__getstate__())
            if _never_prepend(state):
                cached = pickle.loads(pickle.dumps(pre))
                cached.__setstate__(json.dumps(state).encode())
        tokenizer._opd_inner_pre = cached
    return cached


def _never_prepend(pre_tokenizer: Any) -> bool:
    """Turn a Metaspace pre-tokenizer's "▁ before the first section" off (in a Sequence too);
    whether there was one."""
    if not isinstance(pre_tokenizer, dict):
        return False
    changed = False
    if pre_tokenizer.get("type") == "Metaspace" and pre_tokenizer.get("prepend_scheme") == "first":
        pre_tokenizer["prepend_scheme"] = "never"
        changed = True
    for inner in pre_tokenizer.get("pretokenizers") or []:
        changed |= _never_prepend(inner)
    return changed


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """`text` as ordinary tokens: the text of an added token in it is never that token."""
    if not holds_added_token(tokenizer, text):
        return tokenizer.encode(text, add_special_tokens=False)
    return _plain_ids(tokenizer, text)


def encode_with_text_spans(tokenizer: Any, text: str, spans: Iterable[tuple[int, int]]) -> list[int]:
    """`text` tokenized whole, except that each span `[start, end)` holding an added token's text
    is text: only the added tokens outside the spans (the template's markers) are control tokens.
    Text without such spans gets exactly `tokenizer.encode`'s ids."""
    risky = sorted((a, b) for a, b in spans if b > a and holds_added_token(tokenizer, text[a:b]))
    if not risky:
        return tokenizer.encode(text, add_special_tokens=False)
    return encode_sections(tokenizer, text, risky)


def encode_sections(tokenizer: Any, text: str, spans: list[tuple[int, int]]) -> list[int]:
    """`text` as the whole tokenizer tokenizes it, where only the added tokens it finds outside
    `spans` count: it splits its input at added tokens and tokenizes each section between them on
    its own, and so does this, splitting at those markers only. A span's bytes are kept exactly:
    no space is added where a span starts (as a tokenizer that puts "▁" before the start of its
    input would add to a span tokenized alone), and no token is merged across a span's edge that
    the section's own tokenization would not merge."""
    whole = tokenizer.backend_tokenizer.encode(text, add_special_tokens=False)
    added = set(tokenizer.added_tokens_decoder)
    ids: list[int] = []
    at = 0
    for token, (start, end) in zip(whole.ids, whole.offsets):
        # A marker: an added token wholly outside every span (one that overlaps a span is text).
        if token not in added or end <= start or any(start < b and a < end for a, b in spans):
            continue
        ids += _section(tokenizer, text, at, start)
        ids.append(token)
        at = end
    return ids + _section(tokenizer, text, at, len(text))


def _section(tokenizer: Any, text: str, start: int, end: int) -> list[int]:
    """The ids of `text[start:end]`, a section between markers, as ordinary tokens."""
    if end <= start:
        return []
    return _plain_ids(tokenizer, text[start:end], first=start == 0)


def content_spans(render: Callable[[list[dict[str, Any]]], str], messages: list[dict[str, Any]],
                  indices: Iterable[int | tuple[int, str]]) -> list[tuple[int, int]]:
    """Where the content of each message in `indices` (or `(index, text)`: that text at the end of
    its content) lands in `render(messages)`: found by rendering with it replaced by a sentinel
    (letters and digits, which templates and `tojson` keep as they are) and comparing; the
    template may transform the content (quote it, escape it), the span covers what it made of it."""
    real = render(messages)
    spans = []
    for target in indices:
        index, part = target if isinstance(target, tuple) else (target, None)
        sentinel = f"opdsentinel{uuid.uuid4().hex}"
        probe = [dict(m) for m in messages]
        content = probe[index]["content"]
        probe[index]["content"] = sentinel if part is None else content[: len(content) - len(part)] + sentinel
        if part is not None and not content.endswith(part):
            raise TemplateMismatch(f"message {index} does not end with the text to locate")
        shown = render(probe)
        at = shown.find(sentinel)
        length = len(real) - len(shown) + len(sentinel)
        if at < 0 or shown.count(sentinel) != 1 or real[:at] != shown[:at] or real[at + length:] != shown[at + len(sentinel):]:
            raise TemplateMismatch(f"the chat template does not render the content of message {index} ({messages[index].get('role')}) in one place")
        spans.append((at, at + length))
    return spans


def render_ids(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict] | None, add_generation_prompt: bool,
               template_kwargs: Mapping[str, Any] | None = None, untrusted_tails: Iterable[tuple[int, str]] = ()) -> list[int]:
    """The template's rendering of `messages` as ids, user and tool contents as text, and each
    `(index, text)` of `untrusted_tails` (text appended to a trusted message, e.g. a hint added to
    the system prompt) as text too."""
    extra = dict(template_kwargs or {})

    def render(msgs: list[dict[str, Any]]) -> str:
        return tokenizer.apply_chat_template(msgs, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False, **extra)

    risky: list[int | tuple[int, str]] = [i for i, m in enumerate(messages) if m.get("role") in INSERTED_ROLES and holds_added_token(tokenizer, m.get("content"))]
    risky += [(i, tail) for i, tail in untrusted_tails if i not in risky and holds_added_token(tokenizer, tail)]
    text = render(messages)
    return encode_with_text_spans(tokenizer, text, content_spans(render, messages, risky) if risky else [])


def end_marker(tokenizer: Any, before: str, end_token: str | None) -> int:
    """Where the rendered history's last assistant turn ends: after the last `end_token` (the
    special token that ended the sampled turn; default the tokenizer's eos)."""
    marker = end_token if end_token and end_token in before else tokenizer.eos_token
    cut = before.rfind(marker)
    if cut == -1:
        raise TemplateMismatch(f"the rendered history has no end-of-turn token {marker!r}")
    return cut + len(marker)


def continuation_text(tokenizer: Any, history: list[dict[str, Any]], new_messages: list[dict[str, Any]], tools: list[dict] | None,
                      template_kwargs: Mapping[str, Any] | None = None, end_token: str | None = None) -> str:
    """Template text after the last end-of-turn token of `history` (which ends with an assistant
    message) up to and including the generation prompt for the next assistant turn
    (`template_kwargs`: the model preset's chat-template arguments)."""
    return _continuation(tokenizer, history, new_messages, tools, template_kwargs, end_token)[0]


def _continuation(tokenizer: Any, history: list[dict[str, Any]], new_messages: list[dict[str, Any]], tools: list[dict] | None,
                  template_kwargs: Mapping[str, Any] | None, end_token: str | None) -> tuple[str, int, Callable[[list[dict[str, Any]]], str]]:
    extra = dict(template_kwargs or {})
    before = tokenizer.apply_chat_template(history, tools=tools, tokenize=False, **extra)

    def render(msgs: list[dict[str, Any]]) -> str:
        return tokenizer.apply_chat_template(history + msgs, tools=tools, add_generation_prompt=True, tokenize=False, **extra)

    after = render(new_messages)
    cut = end_marker(tokenizer, before, end_token)
    if after[:cut] != before[:cut]:
        # The template re-renders the history once messages follow (Qwen3 drops an empty or earlier
        # <think> block, gpt-oss the analysis channel): the record keeps the sampled ids, and what
        # follows is the template's text after the last end-of-turn marker before the new messages.
        if not new_messages:
            raise TemplateMismatch("the chat template renders earlier turns differently once new messages follow")
        ((first, _),) = content_spans(render, new_messages, [0])
        marker = end_token if end_token and end_token in after[:first] else tokenizer.eos_token
        found = after.rfind(marker, 0, first)
        if found == -1:
            raise TemplateMismatch(f"the chat template renders earlier turns differently once new messages follow, and no {marker!r} precedes them")
        cut = found + len(marker)
    return after[cut:], cut, render


def continuation_ids(tokenizer: Any, history: list[dict[str, Any]], new_messages: list[dict[str, Any]], tools: list[dict] | None,
                     template_kwargs: Mapping[str, Any] | None = None, end_token: str | None = None) -> list[int]:
    """`continuation_text` as ids; the new messages' contents (tool output, a user's reply) are
    tokenized as text (see the module docstring)."""
    text, cut, render = _continuation(tokenizer, history, new_messages, tools, template_kwargs, end_token)
    risky = [i for i, m in enumerate(new_messages) if holds_added_token(tokenizer, m.get("content"))]
    spans = [(max(0, a - cut), b - cut) for a, b in content_spans(render, new_messages, risky) if b > cut] if risky else []
    return encode_with_text_spans(tokenizer, text, spans)


def mistral_call_id() -> str:
    """A tool-call id as Mistral's format requires: 9 letters and digits."""
    return uuid.uuid4().hex[:9]
