"""A multi-turn tool-calling agent over the chat template, token-exact across turns.

Each assistant turn is generated from the ids of everything so far; the ids vLLM sampled (with
the end-of-turn token it sampled) are kept, trained and logprob'd; tool results and the next
generation prompt are the template's own continuation (`opd.agent.chat_tokens`), masked. A turn
with no tool call ends the rollout. Malformed or unknown tool calls get an error message back as
their result; the rollout goes on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from opd import tracing
from opd.agent.chat_tokens import continuation_ids
from opd.agent.tool_calls import ToolCallError, parse_tool_call
from opd.envs.base import Generation, Sequence

_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)

Generate = Callable[..., Awaitable[Generation]]
RunTool = Callable[[str, dict[str, Any]], Awaitable[str]]


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


def extract_calls(text: str) -> list[str]:
    """Bodies of every `<tool_call>` in a turn (an unclosed last one included)."""
    return [m.group(1) for m in _CALL.finditer(text)]


async def run_agent(
    *,
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    generate: Generate,
    run_tool: RunTool,
    allowed_tools: tuple[str, ...],
    max_turns: int,
    max_tokens_per_turn: int,
    max_model_len: int,
    temperature: float,
    top_p: float = 1.0,
    split: str = "train",
) -> AgentRollout:
    """Run the agent until it answers without a tool call, or a limit is reached."""
    prompt = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    rollout = AgentRollout(Sequence.from_prompt(tokenizer.encode(prompt, add_special_tokens=False)), list(messages))
    seq = rollout.sequence
    eos = tokenizer.eos_token_id
    for turn in range(max_turns):
        budget = min(max_tokens_per_turn, max_model_len - len(seq.tokens))
        if budget <= 0:
            rollout.finish = "context"
            break
        gen = await generate(seq.tokens, max_tokens=budget, temperature=temperature, top_p=top_p, split=split)
        start = len(seq.tokens)
        seq.add_generated(gen)
        text = tokenizer.decode([t for t in gen.token_ids if t != eos], skip_special_tokens=False)
        rollout.messages.append({"role": "assistant", "content": text})
        rollout.turns.append(TurnSpan(start, len(seq.tokens), len(rollout.messages) - 1))
        if gen.finish_reason == "length" or not gen.token_ids or gen.token_ids[-1] != eos:
            rollout.finish = "max_tokens"  # cut off mid-turn: nothing to continue from
            break
        bodies = extract_calls(text)
        if not bodies:
            rollout.finish = "answer"
            break
        results = []
        for body in bodies:
            try:
                call = parse_tool_call(body)
            except ToolCallError as err:
                results.append(f"error: {err}")
                rollout.tool_errors += 1
                continue
            if call.name not in allowed_tools:
                results.append(f"error: unknown tool {call.name!r}; available: {', '.join(allowed_tools)}")
                rollout.tool_errors += 1
                continue
            with tracing.span(f"tool {call.name}", "TOOL", call.arguments) as span:
                result = await run_tool(call.name, call.arguments)
                span.outputs(result)
            rollout.tools_used.append(call.name)
            rollout.tool_errors += result.startswith("error:")
            results.append(result)
        tool_messages = [{"role": "tool", "content": r} for r in results]
        if turn == max_turns - 1:
            rollout.messages += tool_messages
            rollout.finish = "max_turns"
            break
        seq.add_inserted(continuation_ids(tokenizer, rollout.messages, tool_messages, tools))
        rollout.messages += tool_messages
    return rollout
