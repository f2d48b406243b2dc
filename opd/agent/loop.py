"""A multi-turn tool-calling agent over the chat template, token-exact across turns.

Each assistant turn is generated from the ids of everything so far; the ids vLLM sampled (with
the end-of-turn token it sampled) are kept, trained and logprob'd; tool results and the next
generation prompt are the template's own continuation (`opd.agent.chat_tokens`), masked. A turn
with no tool call ends the rollout. Malformed or unknown tool calls get an error message back as
their result; the rollout goes on. Tool results are cut to what the context has left, so the
sequence never passes `max_model_len` (`opd.agent.context`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from opd.agent.chat_format import BackgroundParser, ChatFormat, TurnParser, harmony_message
from opd.agent.chat_tokens import mistral_call_id, special_ids
from opd.agent.context import fit_tool_results, room_for_insert
from opd.agent.tool_calls import ToolCall, ToolCallError, run_parsed_call
from opd.latency import phase
from opd.records import Sequence
from opd.serving.vllm_client import Generation
from opd.tools.registry import Toolbox
from opd.tracking.traces import Tracer

# (prompt ids, max_tokens=..., temperature=...) -> one sampled continuation (the env adds its other sampling fields)
Generate = Callable[..., Awaitable[Generation]]


@dataclass
class TurnSpan:
    """Where one assistant turn's sampled ids sit in the sequence, and its message index."""

    start: int
    end: int
    message_index: int


@dataclass
class AgentRollout:
    sequence: Sequence
    messages: list[dict[str, Any]]  # prompt, then assistant (raw text) and tool messages
    turns: list[TurnSpan] = field(default_factory=list)
    tools_used: list[str] = field(default_factory=list)  # names of calls that reached a tool
    tool_errors: int = 0
    finish: str = "answer"  # answer | max_turns | max_tokens | context

    @property
    def turns_used(self) -> int:
        """Assistant turns the model produced (failed server calls never become turns)."""
        return len(self.turns)

    @property
    def generated_tokens(self) -> int:
        return sum(t.end - t.start for t in self.turns)


@dataclass(frozen=True)
class AgentLimits:
    max_turns: int
    max_tokens_per_turn: int
    max_model_len: int


async def run_agent(
    *,
    tokenizer: Any,
    messages: list[dict[str, Any]],
    toolbox: Toolbox,
    generate: Generate,
    limits: AgentLimits,
    temperature: float,
    tracer: Tracer | None = None,
    fmt: ChatFormat | None = None,
    parser: TurnParser | BackgroundParser | None = None,
) -> AgentRollout:
    """Run the agent until it answers without a tool call, or a limit is reached. `fmt`: the
    model's chat format (default: the fixture's, Hermes); `parser`: its parsers, built once per
    environment (built here when not given; a `BackgroundParser` is awaited after the first turn)."""
    fmt = fmt or ChatFormat()
    tools = toolbox.schemas()
    parser = parser or TurnParser(fmt, tokenizer, tools)
    with phase("prompt"):
        rollout = AgentRollout(Sequence.from_prompt(fmt.render_ids(tokenizer, messages, tools, add_generation_prompt=True)), list(messages))
    for turn in range(limits.max_turns):
        turn_ids = await _assistant_turn(rollout, tokenizer, generate, limits, temperature)
        if turn_ids is None:
            break
        with phase("parser_load"):
            ready = parser if isinstance(parser, TurnParser) else await parser.get()
        with phase("parse"):
            calls = ready.parse(rollout.messages[-1]["content"], turn_ids).calls
        if fmt.harmony:  # the Harmony template takes channels and calls as fields, not as text
            rollout.messages[-1] = {**harmony_message(rollout.messages[-1]["content"], calls), "sampled": rollout.messages[-1]["content"]}
        if not calls:
            rollout.finish = "answer"
            break
        with phase("tool"):
            tool_messages = [{"role": "tool", "content": r} for r in await _run_calls(rollout, toolbox, calls, tracer or Tracer.off())]
        if fmt.tool_call_ids == "mistral":
            _add_call_ids(rollout.messages[-1], calls, tool_messages)
        if turn == limits.max_turns - 1:
            rollout.messages += tool_messages
            rollout.finish = "max_turns"
            break
        end_token = tokenizer.convert_ids_to_tokens(turn_ids[-1])
        # The results are cut to what the context has left (opd.agent.context), or end the rollout.
        room = room_for_insert(limits.max_model_len, len(rollout.sequence.tokens), limits.max_tokens_per_turn)
        with phase("prompt"):
            inserted = fit_tool_results(tokenizer, rollout.messages, tool_messages, tools, fmt.render_kwargs, end_token, room)
        rollout.messages += tool_messages
        if inserted is None:
            rollout.finish = "context"
            break
        rollout.sequence.add_inserted(inserted)
    return rollout


async def _assistant_turn(rollout: AgentRollout, tokenizer: Any, generate: Generate, limits: AgentLimits, temperature: float) -> list[int] | None:
    """Generate one assistant turn into the rollout (its text becomes the last message); its
    sampled ids, or None when the rollout must end here (out of context, or cut off mid-turn with
    nothing to continue from). A turn ends on the end-of-turn token or another special token the
    server stops on (Llama's <|eom_id|>, ...)."""
    seq = rollout.sequence
    budget = min(limits.max_tokens_per_turn, limits.max_model_len - len(seq.tokens))
    if budget <= 0:
        rollout.finish = "context"
        return None
    gen = await generate(seq.tokens, max_tokens=budget, temperature=temperature)
    start = len(seq.tokens)
    seq.add_generated(gen.token_ids, gen.logprobs)
    ids = list(gen.token_ids)
    ended = gen.finish_reason != "length" and bool(ids) and (ids[-1] == tokenizer.eos_token_id or ids[-1] in special_ids(tokenizer))
    with phase("parse"):
        text = tokenizer.decode(ids[:-1] if ended else [t for t in ids if t != tokenizer.eos_token_id], skip_special_tokens=False)
    rollout.messages.append({"role": "assistant", "content": text})
    rollout.turns.append(TurnSpan(start, len(seq.tokens), len(rollout.messages) - 1))
    if not ended:
        rollout.finish = "max_tokens"
        return None
    return ids


def _add_call_ids(assistant: dict[str, Any], calls: list[ToolCall | ToolCallError], results: list[dict[str, Any]]) -> None:
    """Mistral's format: the turn's calls as `tool_calls` with 9-character ids, and each result
    naming its call's id (its template and vLLM's parser expect them). The turn's sampled ids are
    kept as they are: the template renders the call with its id, which the model did not write."""
    entries = []
    for call, result in zip(calls, results):
        call_id = mistral_call_id()
        name, arguments = (call.name, call.arguments) if isinstance(call, ToolCall) else ("invalid_tool_call", {})
        entries.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}})
        result["tool_call_id"] = call_id
    assistant["tool_calls"] = entries


async def _run_calls(rollout: AgentRollout, toolbox: Toolbox, calls: list[ToolCall | ToolCallError], tracer: Tracer) -> list[str]:
    """Run every call of one turn in order; the text each returns to the model."""
    results = []
    for call in calls:
        outcome = await run_parsed_call(toolbox, call, tracer)
        if outcome.ran:
            rollout.tools_used.append(outcome.name or "")
        rollout.tool_errors += outcome.status != "ok"
        results.append(outcome.as_text())
    return results
