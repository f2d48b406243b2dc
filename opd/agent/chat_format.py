"""A model family's chat format: its tool calls and reasoning parsed by vLLM's own parsers.

The parsers are the ones a vLLM user names with `--tool-call-parser` and `--reasoning-parser`
(`model.tool_call_parser`, `model.reasoning_parser`), run on the exact text the model sampled, so
every format vLLM supports works in both environments. vLLM is imported on first use only (its
parser modules cost seconds to import).

vLLM's parsers return no call at all when any call of a turn is malformed; here each call is then
parsed on its own, so well-formed calls still run and each malformed one gets an error result.
`check` is the start-up check: the template renders the tools, the markers are tokens.
`BackgroundParser` builds a `TurnParser` on a thread of its own while the first requests go out.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from string import Template
from typing import Any, Callable, Mapping

from opd.agent.chat_tokens import encode_with_text_spans, render_ids, special_ids
from opd.agent.tool_calls import ToolCall, ToolCallError, parse_tool_call
from opd.config import ConfigError, project_path

logger = logging.getLogger(__name__)

# The longest text handed to vLLM's parsers at once; a longer turn is refused as malformed.
MAX_PARSE_CHARS = 200_000
# Most calls read from one turn when they are parsed one by one (the rest: one error).
MAX_CALLS_PER_TURN = 32


class ChatFormatError(ConfigError):
    """The model's tokenizer, chat template or parser names cannot carry this format (`model.*`)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "model")


@dataclass(frozen=True)
class ChatFormat:
    """What the model preset says about the format (conf/model/*.yaml)."""

    tool_parser: str = "hermes"
    reasoning_parser: str | None = None
    call_start: str = "<tool_call>"
    call_end: str = "</tool_call>"
    call_template: str = '<tool_call>\n{"name": $name, "arguments": $arguments}\n</tool_call>'
    response_template: str = "\n<tool_response>\n$result\n</tool_response>\n"
    required_tokens: tuple[str, ...] = ("<tool_call>", "</tool_call>")
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    chat_template: str | None = None  # a template's text replacing the tokenizer's
    tool_call_ids: str | None = None  # "mistral": calls and results carry 9-character ids
    reasoning_end: str = "</think>"  # what ends the reasoning; the answer follows it

    @classmethod
    def from_config(cls, model: Any) -> "ChatFormat":
        """From a validated `ModelConfig` (or anything with its fields); reads its template file."""
        template = None
        if model.chat_template:
            try:
                template = project_path(model.chat_template).read_text(encoding="utf-8")
            except OSError as err:
                raise ChatFormatError(f"model.chat_template: cannot read {model.chat_template}: {err}") from None
        return cls(model.tool_call_parser, model.reasoning_parser, model.tool_call_start, model.tool_call_end, model.call_template,
                   model.tool_response_template, tuple(model.required_tokens), dict(model.chat_template_kwargs), template,
                   getattr(model, "tool_call_ids", None), getattr(model, "reasoning_end", "</think>"))

    @property
    def render_kwargs(self) -> dict[str, Any]:
        """Extra arguments of every `apply_chat_template` call: the template arguments, and the
        replacement template when there is one."""
        return {**self.template_kwargs, **({"chat_template": self.chat_template} if self.chat_template else {})}

    @property
    def harmony(self) -> bool:
        """gpt-oss's Harmony format (vLLM parses it with its own Harmony parser)."""
        return self.tool_parser == "openai"

    def call_text(self, name: str, arguments: dict[str, Any]) -> str:
        """One call as the model is asked to write it."""
        return Template(self.call_template).substitute(name=json.dumps(name), function=name, arguments=json.dumps(arguments))

    def render(self, tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict] | None, add_generation_prompt: bool = False) -> str:
        """The chat template's text for `messages`, with this format's template arguments."""
        return tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False, **self.render_kwargs)

    def render_ids(self, tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict] | None, add_generation_prompt: bool = False) -> list[int]:
        """`render` as ids, with system, user and tool contents tokenized as text (no control
        token ever comes from them; `opd.agent.chat_tokens`)."""
        return render_ids(tokenizer, messages, tools, add_generation_prompt, self.render_kwargs)

    def response_text(self, result: Any, function: str = "", call_id: str = "") -> str:
        """What inline_math inserts after a call (masked in the record): `$result` as JSON, the
        called function's name as `$function`, its call's id as `$call_id`."""
        return self._response(result, function, call_id)[0]

    def response_ids(self, tokenizer: Any, result: Any, function: str = "", call_id: str = "") -> list[int]:
        """`response_text(...)` as ids: the format's markers as tokens, the result and the name
        (which the model wrote) as text."""
        text, spans = self._response(result, function, call_id)
        return encode_with_text_spans(tokenizer, text, spans)

    def _response(self, result: Any, function: str, call_id: str) -> tuple[str, list[tuple[int, int]]]:
        """The response text and where the values it was filled with lie in it."""
        values = {"result": json.dumps(result, ensure_ascii=False), "function": function, "call_id": call_id}
        parts: list[str] = []
        spans: list[tuple[int, int]] = []
        at = 0
        for found in Template.pattern.finditer(self.response_template):
            parts.append(self.response_template[at:found.start()])
            name = found.group("named") or found.group("braced")
            if name is None:  # `$$`, a dollar sign
                parts.append("$" if found.group("escaped") is not None else found.group())
            elif name not in values:
                raise ChatFormatError(f"model.tool_response_template: unknown placeholder ${name} (known: $result, $function, $call_id)")
            else:
                start = sum(map(len, parts))
                parts.append(values[name])
                spans.append((start, start + len(values[name])))
            at = found.end()
        parts.append(self.response_template[at:])
        return "".join(parts), spans

    def response_values(self, text: str) -> dict[str, str] | None:
        """What a response text was filled with (`result` as JSON text, `function`, `call_id`:
        the placeholders the template has), or None when `text` is not one of this format's."""
        pattern: list[str] = []
        seen: set[str] = set()
        at = 0
        for found in Template.pattern.finditer(self.response_template):
            pattern.append(re.escape(self.response_template[at:found.start()]))
            name = found.group("named") or found.group("braced")
            if name is None:
                pattern.append(re.escape("$" if found.group("escaped") is not None else found.group()))
            elif name in seen:
                pattern.append(f"(?P={name})")
            else:
                pattern.append("(?P<result>.*)" if name == "result" else f"(?P<{name}>.*?)")
                seen.add(name)
            at = found.end()
        pattern.append(re.escape(self.response_template[at:]))
        match = re.fullmatch("".join(pattern), text, re.DOTALL)
        return match.groupdict() if match else None

    def call_ends_message(self, tokenizer: Any) -> bool:
        """Whether a call ends the assistant's message (its end marker is one special token:
        Llama's <|eot_id|>, Mistral's </s>, Harmony's <|call|>): the result is then a tool message
        of the template's, and any special token the model ends a message with (Llama's
        <|eom_id|> too) ends the call."""
        ids = tokenizer.encode(self.call_end, add_special_tokens=False)
        return len(ids) == 1 and ids[0] in special_ids(tokenizer)

    def reasoning_ended(self, tokenizer: Any, text: str, token_ids: list[int] | tuple[int, ...]) -> bool:
        """Whether the model ended its reasoning before the first call it wrote in one stretch of
        sampled text (`text`, from `token_ids`). Decided on the ids where the marker holds an added
        token (Qwen3's and R1's `</think>`, Harmony's `<|channel|>final<|message|>`): the marker's
        ids, sampled before the call starts; what a call's arguments hold (a program printing
        `</think>`) is the call's. A marker of ordinary tokens (`</think>` for Llama or Mistral) is
        looked for in the text before the call."""
        start = text.find(self.call_start)
        head = text if start == -1 else text[:start]
        marker = tokenizer.encode(self.reasoning_end, add_special_tokens=False)
        added = set(tokenizer.added_tokens_decoder)
        if not marker or not any(i in added for i in marker):
            return self.reasoning_end in head
        ids = list(token_ids)
        for at in range(len(ids) - len(marker) + 1):
            if ids[at:at + len(marker)] == marker:
                return self.call_start not in tokenizer.decode(ids[:at], skip_special_tokens=False)
        return False


@dataclass(frozen=True)
class ParsedTurn:
    """One assistant turn as vLLM's parsers read it: reasoning, content, and each call in order
    (a `ToolCallError` where a call is malformed)."""

    reasoning: str | None
    content: str | None
    calls: list[ToolCall | ToolCallError]


class TurnParser:
    """vLLM's tool-call and reasoning parsers of one `ChatFormat`, bound to a tokenizer and tools."""

    def __init__(self, fmt: ChatFormat, tokenizer: Any, tools: list[dict] | None) -> None:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.parser.parser_manager import ParserManager

        # vLLM logs a traceback for every malformed call; here each one is an error result instead.
        for name in ("vllm.tool_parsers", "vllm.parser", "vllm.reasoning"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
        self.fmt = fmt
        self.tokenizer = tokenizer
        self.request = ChatCompletionRequest(model="opd", messages=[{"role": "user", "content": ""}], tools=tools or None)
        try:
            both = ParserManager.get_parser(tool_parser_name=fmt.tool_parser, reasoning_parser_name=fmt.reasoning_parser,
                                            enable_auto_tools=True, is_harmony=fmt.harmony, tokenizer=tokenizer)
            calls_only = ParserManager.get_parser(tool_parser_name=fmt.tool_parser, enable_auto_tools=True,
                                                  is_harmony=fmt.harmony, tokenizer=tokenizer)
        except (TypeError, KeyError, ValueError) as err:
            raise ChatFormatError(f"vLLM parsers tool_call_parser={fmt.tool_parser!r}, reasoning_parser={fmt.reasoning_parser!r}: {err}") from None
        assert both is not None and calls_only is not None
        self._both = both(tokenizer, self.request.tools)
        self._calls_only = calls_only(tokenizer, self.request.tools)

    def parse(self, text: str, token_ids: list[int] | tuple[int, ...] = ()) -> ParsedTurn:
        """Reasoning, content and calls of one whole assistant turn (`text` as sampled)."""
        if len(text) > MAX_PARSE_CHARS:
            return ParsedTurn(None, text, [ToolCallError(f"turn longer than {MAX_PARSE_CHARS} characters")] if self.fmt.call_start in text else [])
        try:
            reasoning, content, calls = self._both.parse(text, self.request, enable_auto_tools=True, model_output_token_ids=list(token_ids))
        except Exception as err:  # a parser bug must not end the rollout: the turn is malformed
            logger.debug("vLLM parser %s raised %s", self.fmt.tool_parser, err)
            reasoning, content, calls = None, text, None
        if calls:
            return ParsedTurn(reasoning, content, _capped([_to_call(c.name, c.arguments) for c in calls]))
        if self.fmt.harmony:  # Harmony's parser reads the ids; it found no call
            return ParsedTurn(reasoning, content, [ToolCallError("not a well-formed Harmony tool call")] if "<|call|>" in text else [])
        # Reasoning parsers that keep calls out of the reasoning leave them in the content.
        region = content if self.fmt.reasoning_parser else text
        return ParsedTurn(reasoning, content, self.calls(region or ""))

    def calls(self, text: str, token_ids: list[int] | tuple[int, ...] = ()) -> list[ToolCall | ToolCallError]:
        """Every call in `text`, reasoning not separated: each call the format's parser reads, or,
        when it reads none but a call starts, each piece from one call start to the next on its own.
        (Harmony's parser reads the sampled `token_ids`, which it needs.)"""
        if self.fmt.call_start not in text and not (self.fmt.harmony and "functions." in text):
            return []
        found = self._parse_calls(text, token_ids if self.fmt.harmony else ())
        if found:
            return _capped(found)
        pieces = text.split(self.fmt.call_start)[1:]
        out: list[ToolCall | ToolCallError] = []
        if len(pieces) > MAX_CALLS_PER_TURN:
            out.append(ToolCallError(f"{len(pieces)} tool calls in one turn; only the first {MAX_CALLS_PER_TURN} are read"))
        for piece in pieces[:MAX_CALLS_PER_TURN]:
            out += self._parse_calls(self.fmt.call_start + piece) or [self._why(piece)]
        return out

    def _why(self, piece: str) -> ToolCallError:
        """The error shown for a call the parser refused: the JSON's own fault where the body is
        JSON-shaped (what the model can fix), else the text that did not parse."""
        body = piece.split(self.fmt.call_end, 1)[0]
        try:
            parse_tool_call(body.strip().removeprefix("[").removesuffix("]"))
        except ToolCallError as err:
            return ToolCallError(f"{err} (a {self.fmt.tool_parser} tool call)")
        return ToolCallError(f"not a well-formed {self.fmt.tool_parser} tool call: {(self.fmt.call_start + piece)[:120]!r}")

    def _parse_calls(self, text: str, token_ids: list[int] | tuple[int, ...] = ()) -> list[ToolCall | ToolCallError]:
        try:
            _, _, calls = self._calls_only.parse(text, self.request, enable_auto_tools=True, model_output_token_ids=list(token_ids))
        except Exception as err:
            logger.debug("vLLM parser %s raised %s", self.fmt.tool_parser, err)
            return []
        return [_to_call(c.name, c.arguments) for c in calls or []]


class BackgroundParser:
    """A `TurnParser` built on a thread of its own: vLLM's parser modules import torch, seconds
    that the first requests need not wait for.
    `get()` waits for it and raises what building it raised (a `ChatFormatError` for bad parser
    names, which ends the run: every rollout parses, so no group is written before it)."""

    def __init__(self, build: Callable[[], TurnParser]) -> None:
        self._future: concurrent.futures.Future[TurnParser] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._build, args=(build,), name="turn-parser", daemon=True)
        self._thread.start()

    def _build(self, build: Callable[[], TurnParser]) -> None:
        try:
            self._future.set_result(build())
        except BaseException as err:  # handed to every caller of get()
            self._future.set_exception(err)

    async def get(self) -> TurnParser:
        """The parser, once built (at once after the first time)."""
        if not self._future.done():
            await asyncio.wrap_future(self._future)
        return self._future.result()

    def join(self, timeout: float) -> None:
        """Let a build in progress finish (an interpreter exiting mid-import can crash)."""
        self._thread.join(timeout)


def _capped(calls: list[ToolCall | ToolCallError]) -> list[ToolCall | ToolCallError]:
    """The first `MAX_CALLS_PER_TURN` calls of a turn, then one error saying the rest were not read."""
    if len(calls) <= MAX_CALLS_PER_TURN:
        return calls
    return [*calls[:MAX_CALLS_PER_TURN], ToolCallError(f"{len(calls)} tool calls in one turn; only the first {MAX_CALLS_PER_TURN} are read")]


def _to_call(name: str | None, arguments: str | None) -> ToolCall | ToolCallError:
    if not name:
        return ToolCallError("tool call has no name")
    try:
        parsed = json.loads(arguments or "{}")
    except (ValueError, RecursionError):  # JSON errors, and integers past Python's digit limit
        return ToolCallError(f'the arguments of {name!r} are not JSON')
    if isinstance(parsed, str):  # arguments given as a JSON string of an object
        try:
            parsed = json.loads(parsed)
        except (ValueError, RecursionError):  # JSON errors, and integers past Python's digit limit
            return ToolCallError(f'"arguments" of {name!r} is a string that is not a JSON object')
    if not isinstance(parsed, dict):
        return ToolCallError(f'"arguments" of {name!r} must be a JSON object')
    return ToolCall(name, parsed)


def check(fmt: ChatFormat, tokenizer: Any, tools: list[dict], model: str) -> None:
    """The start-up check: the preset's marker tokens exist and the chat template renders the
    tools; else a `ChatFormatError` naming the model, the template and what is missing. (The
    parser names are checked by building the `TurnParser`, off the start-up path.)"""
    vocab = tokenizer.get_vocab()
    missing = [t for t in fmt.required_tokens if t not in vocab]
    template = "the chat template model.chat_template" if fmt.chat_template else f"the chat template of {getattr(tokenizer, 'name_or_path', model)!s}"
    if missing:
        raise ChatFormatError(f"model {model!r}: the {fmt.tool_parser} format needs the tokens {missing}, which {template} "
                              "tokenizer does not have (wrong model=... preset for this model?)")
    probe = [{"role": "system", "content": "probe"}, {"role": "user", "content": "probe"}]
    try:
        text = fmt.render(tokenizer, probe, tools, add_generation_prompt=True)
    except Exception as err:
        raise ChatFormatError(f"model {model!r}: {template} fails to render a conversation with tools: {type(err).__name__}: {err}") from None
    absent = [t["function"]["name"] for t in tools if t["function"]["name"] not in text]
    if absent:
        raise ChatFormatError(f"model {model!r}: {template} does not render the tools {absent} (it ignores `tools=`); "
                              "give the model a template that renders tools, or choose another model preset")


_HARMONY_END = ("<|end|>", "<|call|>", "<|return|>")


def _harmony_channel(text: str, channel: str) -> str:
    """The messages of one Harmony channel in a sampled turn, joined (their headers dropped)."""
    parts = []
    for piece in text.split(f"<|channel|>{channel}")[1:]:
        body = piece.split("<|message|>", 1)[1] if "<|message|>" in piece else ""
        for end in _HARMONY_END:
            body = body.split(end, 1)[0]
        parts.append(body)
    return "\n".join(parts)


def harmony_recipient(text: str) -> str | None:
    """The function a sampled Harmony turn's last call addresses (`to=functions.NAME`), as the
    model wrote it (None: it addresses none)."""
    _, found, rest = text.rpartition("to=functions.")
    if not found:
        return None
    name = rest.split("<|", 1)[0].split(maxsplit=1)
    return name[0] if name else None


def harmony_message(text: str, calls: list[ToolCall | ToolCallError]) -> dict[str, Any]:
    """A sampled gpt-oss turn as the Harmony chat template takes it: the analysis channel as
    `thinking`, the final channel as `content`, the first call as `tool_calls` (one per message;
    a malformed call under the name the model addressed, which its result then names)."""
    message: dict[str, Any] = {"role": "assistant", "content": _harmony_channel(text, "final")}
    thinking = _harmony_channel(text, "analysis")
    if thinking:
        message["thinking"] = thinking
    first = next((c for c in calls if isinstance(c, ToolCall)), None)
    if calls:
        name, arguments = (first.name, first.arguments) if first is not None else (harmony_recipient(text) or "invalid_tool_call", {})
        message["tool_calls"] = [{"type": "function", "function": {"name": name, "arguments": arguments}}]
        message["content"] = ""  # the template takes the analysis of a call from `thinking` only
    return message
