"""inline_math: tool calls inside one open `<think>` block, then a `\\boxed{}` answer.

One rollout is one assistant turn built from token ids:

    prompt ids -> generate until `</tool_call>` -> run the tool -> insert the tool response ids
    (masked) -> generate again from all ids so far -> ... -> `</think>` ... `\\boxed{answer}` EOS

The call markers, the call's parser and the response text are the model family's
(`opd.agent.chat_format`): generation stops on the format's end marker as text, however the
tokenizer splits it, and the call is read by vLLM's parser of that format. Where a call ends the
assistant's message (Llama, Mistral, gpt-oss), any special token the model ends it with ends the
call (Llama's `<|eom_id|>` as its `<|eot_id|>`), and the response is the template's tool message
naming the called function (and the call's id, for Mistral). Whether the model ended its thinking
before a call is decided on the sampled ids, never on what the call's arguments hold.

The record holds exactly the ids vLLM sampled (never re-tokenised text) with their logprobs;
the inserted tool responses are masked (-100) and carry no logprob. Generation is bounded by
`max_tool_calls`, `max_new_tokens` and the server's context length, and a tool response is cut to
what the context has left (`opd.agent.context`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from opd import latency
from opd.agent.chat_format import harmony_message, harmony_recipient
from opd.agent.chat_tokens import holds_added_token, mistral_call_id, special_ids
from opd.agent.context import fit_result, room_for_insert
from opd.agent.tool_calls import ToolCall, ToolCallError, run_parsed_call
from opd.config import InlineMathEnvConfig, InlineMathRewardConfig
from opd.envs import math_prompt
from opd.envs.base import RolloutEnv, RolloutResult
from opd.records import Sequence
from opd.rewards import math as rewards
from opd.rewards.rubric import Scored
from opd.rewards.verifier import Verifier
from opd.tools import math_tools
from opd.tools.calculator import CalculatorLimits
from opd.tools.registry import Toolbox, ToolOutcome

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from atroposlib.envs.base import ScoredDataGroup


@dataclass
class Rollout:
    """A finished rollout: its aligned token record and what happened in it."""

    sequence: Sequence
    text: str = ""  # the assistant turn, tool responses included, as decoded from its ids
    # The model's own text, which is scored: the sampled segments with each inserted tool response
    # replaced by a line break (tool output can print `</think>` or a box; no marker spans a response)
    # and each answered call's body left out (its arguments can hold `</think>` too; its start marker stays).
    written: str = ""
    # The conversation after the prompt, as the family's chat template takes it (the record's
    # `messages`): one assistant message holding the whole turn where responses are inserted inside
    # it; else an assistant message per call and a tool message per result (its content the result's JSON).
    messages: list[dict[str, Any]] = field(default_factory=list)
    tool_calls_run: int = 0  # calls that reached a tool (its result may be an error)
    tool_errors: int = 0  # calls whose result is an error: malformed, refused or failed
    finish: str = "eos"  # eos | max_new_tokens | context | tool_after_think
    generated_tokens: int = 0
    verify_timed_out: bool = False  # math-verify ran out of time on the answer (not verified)
    inserted_control_text: bool = False  # a tool's output held a control token's text (never a few-shot)


class InlineMathEnv(RolloutEnv):
    """The inline_math environment (see module docstring)."""

    name = "inline_math"
    # The whole score from reward=<env> (checked before any server starts: opd.build.preflight).
    build_rubric = staticmethod(rewards.rubric)
    # The record keeps the problem's answer (the viewer shows it) and the rollout's token budget.
    item_fields = ("answer",)
    budget_fields = ("max_new_tokens",)
    # The tools the model is shown.
    tool_schemas = math_prompt.TOOLS

    def __init__(self, cfg: InlineMathEnvConfig, reward: InlineMathRewardConfig, **common: Any) -> None:
        super().__init__(cfg, reward, **common)
        self.reward_cfg = reward
        self.verifier = Verifier(reward.verify_workers, reward.verify_timeout_s)
        self._verifier_start: asyncio.Task[None] | None = None
        self.toolbox = Toolbox(math_tools.TOOLS, math_tools.MathTools(CalculatorLimits(max_chars=cfg.calculator_max_chars), cfg.sandbox))
        self.dynamic_pool: list[tuple[str, str]] = []
        fmt = self.chat_format
        # A call ends the assistant's message (Llama, Mistral, gpt-oss): results are tool messages.
        self.call_ends_message = fmt.call_ends_message(self.tokenizer)
        tools = self.toolbox.schemas()
        # The few-shots start inside <think> where the template opens it for every assistant turn (R1).
        self.few_shots = math_prompt.few_shots(fmt, think_opened=math_prompt.template_opens_think(fmt, self.tokenizer, tools))
        self.system_prompt = math_prompt.system_prompt(fmt, cfg.tool_instruction)
        # Where the template drops what earlier assistant turns hold (Qwen3 drops their thinking, and
        # with it the few-shots' calls), the few-shots go into the system prompt as text instead.
        self.shots_in_system = not math_prompt.template_keeps_shots(fmt, self.tokenizer, tools, self.system_prompt, self.few_shots)
        if self.shots_in_system:
            logger.info("the chat template drops the reasoning of earlier assistant turns: inline_math's few-shots go into the system prompt")
        # What marks tool text after </think> as a format violation: a call, or an inserted response.
        self.tool_markers = (fmt.call_start, fmt.response_template.split("$")[0].strip() or fmt.call_start)

    async def setup(self) -> None:
        """Start math-verify's workers beside the first requests: the first groups' scoring then
        does not wait a second or more for a worker to import math-verify."""
        if self._verifier_start is None:
            self._verifier_start = asyncio.create_task(self.verifier.start())
            self._verifier_start.add_done_callback(_log_failed_start)
        await super().setup()

    async def ready(self) -> None:
        await super().ready()
        if self._verifier_start is not None:
            await self._verifier_start

    def prompt_messages(self, problem: str, use_pool: bool) -> list[dict[str, str]]:
        """System prompt, few-shots (as turns, or in the system prompt) and the problem."""
        shots = list(self.few_shots[: self.cfg.few_shots])
        if use_pool and self.cfg.dynamic_shots and self.dynamic_pool:
            shots += self.dynamic_pool[-self.cfg.dynamic_shots :]
        return math_prompt.build_messages(problem + self.cfg.problem_suffix, shots, self.system_prompt, shots_in_system=self.shots_in_system)

    def prompt_ids(self, problem: str, use_pool: bool) -> list[int]:
        return self.render_prompt(self.prompt_messages(problem, use_pool))

    def render_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        return self.chat_format.render_ids(self.tokenizer, messages, self.toolbox.schemas(), add_generation_prompt=True)

    # ---- one rollout -----------------------------------------------------------------------

    def prepare(self, item: dict[str, Any], training: bool) -> tuple[list[dict[str, str]], list[int]]:
        """The prompt every rollout of a group shares (its messages and ids): with the dynamic
        few-shots in training, without them in evaluation."""
        with latency.phase("prompt"):
            messages = self.prompt_messages(item["problem"], use_pool=training)
            return messages, self.render_prompt(messages)

    async def rollout(self, item: dict[str, Any], temperature: float, prepared: tuple[list[dict[str, str]], list[int]]) -> RolloutResult:
        """One assistant turn from the prepared prompt, scored as soon as it ends: a verifier round
        trip overlaps the other rollouts' generation."""
        messages, prompt = prepared
        rollout = await self.turn(prompt, temperature)
        with latency.phase("reward"):
            scored = await self.score(rollout, item["answer"])
        return RolloutResult(
            rollout.sequence, scored, rollout.finish, rollout.tool_calls_run, rollout.tool_errors, rollout.generated_tokens,
            messages + rollout.messages, {"verify_timed_out": rollout.verify_timed_out},
            prompt=item["problem"], response=rollout.text, turns=1 + rollout.tool_calls_run, state=rollout,
            eval_metrics={"tool_use_rate": float(rollout.tool_calls_run > 0), "format_violation_rate": scored.signals["format_violation"]},
        )

    async def turn(self, prompt_ids: list[int], temperature: float) -> Rollout:
        """Generate one assistant turn with inline tool calls (see module docstring)."""
        rollout = Rollout(Sequence.from_prompt(prompt_ids))
        end = self.chat_format.call_end
        specials = special_ids(self.tokenizer)
        # Where a call ends the message, its end is a special token that stops generation by itself
        # (the model's end-of-message ids); a stop string would also stop on its text inside a
        # call's arguments (a program that prints "</s>").
        stop = None if self.call_ends_message else [end]
        since = 0  # where the text after the last inserted tool response starts
        since_id = len(prompt_ids)  # and its ids
        since_written = 0  # and its part of `written`
        while (budget := self._budget(rollout)) > 0:
            gen = await self.generate(rollout.sequence.tokens, max_tokens=budget, temperature=temperature, stop=stop)
            before = len(rollout.text)
            rollout.sequence.add_generated(gen.token_ids, gen.logprobs)
            rollout.generated_tokens += len(gen.token_ids)
            with latency.phase("parse"):
                piece = self.tokenizer.decode(gen.token_ids, skip_special_tokens=False)
            rollout.text += piece
            rollout.written += piece
            if gen.finish_reason == "length":
                continue  # the budget ends it, or the next segment continues it
            # vLLM stops on the marker as text: it is in the new text (or spans the previous
            # segment's end). Its ids are already in the record; never append it again. Where a
            # call ends the message, the special token the model ended it with may end a call too.
            last = gen.token_ids[-1] if gen.token_ids else None
            ended_message = last in specials
            if end not in rollout.text[max(since, before - len(end) + 1):] and not (self.call_ends_message and ended_message):
                rollout.finish = "eos"
                break
            segment, segment_ids = rollout.text[since:], rollout.sequence.tokens[since_id:]
            with latency.phase("parser_load"):
                parser = await self.parser.get()
            with latency.phase("parse"):
                calls = parser.calls(segment, segment_ids)
            if not calls and ended_message:
                rollout.finish = "eos"  # the message ended (Mistral's </s> is its call end too) and no call came
                break
            if self.chat_format.reasoning_ended(self.tokenizer, segment, segment_ids):
                rollout.finish = "tool_after_think"
                break
            call = calls[-1] if calls else ToolCallError(f"{end} without {self.chat_format.call_start}")
            self._leave_out_call_body(rollout, since_written)
            with latency.phase("tool"):
                inserted = await self._answer_call(rollout, call, segment, segment_ids, calls)
            if not inserted:  # not even an emptied response fits the context
                rollout.finish = "context"
                break
            since, since_id, since_written = len(rollout.text), len(rollout.sequence.tokens), len(rollout.written)
        else:
            rollout.finish = "max_new_tokens" if rollout.generated_tokens >= self.cfg.max_new_tokens else "context"
        self._close_messages(rollout, len(prompt_ids), since_id)
        return rollout

    def _leave_out_call_body(self, rollout: Rollout, since_written: int) -> None:
        """`written` without the body of the call its last segment ends with (its start marker kept)."""
        start = rollout.written.find(self.chat_format.call_start, since_written)
        if start != -1:
            rollout.written = rollout.written[: start + len(self.chat_format.call_start)]

    def _assistant_message(self, ids: list[int], calls: list[Any] | None = None) -> dict[str, Any]:
        """One sampled stretch as an assistant message (its end-of-message token left out, as the
        template adds its own); a Harmony turn's channels and call as the template's fields."""
        ended = bool(ids) and ids[-1] in special_ids(self.tokenizer)
        text = self.tokenizer.decode(ids[:-1] if ended else ids, skip_special_tokens=False)
        if self.chat_format.harmony:
            return {**harmony_message(text, calls or []), "sampled": text}
        return {"role": "assistant", "content": text}

    def _close_messages(self, rollout: Rollout, prompt_len: int, since_id: int) -> None:
        """The rollout's conversation after the prompt, once it has ended."""
        if self.call_ends_message:
            if len(rollout.sequence.tokens) > since_id:
                rollout.messages.append(self._assistant_message(rollout.sequence.tokens[since_id:]))
        else:
            rollout.messages = [self._assistant_message(rollout.sequence.tokens[prompt_len:])]

    def _budget(self, rollout: Rollout) -> int:
        return min(self.cfg.max_tokens_per_segment, self.cfg.max_new_tokens - rollout.generated_tokens, self.max_model_len - len(rollout.sequence.tokens))

    async def _answer_call(self, rollout: Rollout, call: Any, segment: str, segment_ids: list[int], calls: list[Any]) -> bool:
        """Run the call the text ends with (or refuse it) and insert its response, masked, its
        text cut to what the context has left (`opd.agent.context`); False when not even an
        emptied response fits (nothing inserted)."""
        if rollout.tool_calls_run >= self.cfg.max_tool_calls:
            outcome = ToolOutcome("malformed", error=f"tool call limit ({self.cfg.max_tool_calls}) reached; give the final answer now")
        else:
            outcome = await run_parsed_call(self.toolbox, call, self.tracer)
        rollout.tool_calls_run += outcome.ran
        rollout.tool_errors += outcome.status != "ok"
        shown = outcome.content if outcome.content is not None else {"error": outcome.error}
        fmt = self.chat_format
        # The function the model called, as it named it (a Harmony result names it), and the id the
        # format gives the call (a Mistral result names it).
        function = call.name if isinstance(call, ToolCall) else (harmony_recipient(segment) if fmt.harmony else None) or "invalid_tool_call"
        call_id = mistral_call_id() if fmt.tool_call_ids == "mistral" else ""
        room = room_for_insert(self.max_model_len, len(rollout.sequence.tokens), self.cfg.max_tokens_per_segment)
        # The tool's output is text: a program that prints a control token's text gets ordinary tokens.
        fitted = fit_result(lambda result: fmt.response_ids(self.tokenizer, result, function, call_id), shown, room)
        if fitted is None:
            return False
        shown, ids = fitted
        response = fmt.response_text(shown, function, call_id)
        rollout.sequence.add_inserted(ids)
        rollout.inserted_control_text |= holds_added_token(self.tokenizer, json.dumps(shown, ensure_ascii=False))
        rollout.text += response
        rollout.written += "\n"
        if self.call_ends_message:
            message = self._assistant_message(segment_ids, calls)
            result: dict[str, Any] = {"role": "tool", "content": json.dumps(shown, ensure_ascii=False)}
            if call_id:
                arguments = call.arguments if isinstance(call, ToolCall) else {}
                message["tool_calls"] = [{"id": call_id, "type": "function", "function": {"name": function, "arguments": json.dumps(arguments, ensure_ascii=False)}}]
                result["tool_call_id"] = call_id
            rollout.messages += [message, result]
        return True

    async def score(self, rollout: Rollout, answer: str) -> Scored:
        end = self.chat_format.reasoning_end
        correct = await rewards.check_answer(rollout.written, answer, self.verifier, self.reward_cfg.max_answer_chars, end)
        rollout.verify_timed_out = correct is None
        return self.rubric.score(rewards.MathOutcome(rollout.written, rollout.tool_calls_run, bool(correct), self.tool_markers, end))

    # ---- groups ----------------------------------------------------------------------------

    async def finish_group(self, group: ScoredDataGroup, item: dict[str, Any], results: list[RolloutResult], roots: list[Any], rows: Any) -> None:
        self._grow_pool(item["problem"], [r.state for r in results], [r.scored for r in results])

    def _grow_pool(self, problem: str, rollouts: list[Rollout], scored: list[Scored]) -> None:
        """Keep one correct, well-formed rollout that used a tool as a future few-shot example."""
        if self.cfg.dynamic_pool_size == 0 or self.chat_format.harmony:  # a Harmony turn's channels are not message text
            return
        for rollout, result in zip(rollouts, scored):
            if result.signals["correct"] and rollout.tool_calls_run > 0 and not result.signals["format_violation"] and not rollout.inserted_control_text:
                self.dynamic_pool.append((problem, self._as_example(rollout)))
                del self.dynamic_pool[: -self.cfg.dynamic_pool_size]
                break

    def _as_example(self, rollout: Rollout) -> str:
        """A rollout as a few-shot answer: its whole turn, without the end-of-turn token it ended
        with (the template closes the turn itself, and in the system prompt it would end it)."""
        if not self.call_ends_message:
            return str(rollout.messages[-1]["content"])
        last = rollout.sequence.tokens[-1]
        return rollout.text.removesuffix(self.tokenizer.convert_ids_to_tokens(last)) if last in special_ids(self.tokenizer) else rollout.text

    def env_metrics(self, group: dict[str, Any]) -> dict[str, float]:
        details = group["overrides"]
        n = len(details)
        return {
            # The inline reference's name for it (there it could exceed 1; here it is a fraction).
            "train/percent_correct": sum(d["passed"] for d in details) / n,
            "tool_use_rate": sum(d["tool_calls"] > 0 for d in details) / n,
            "tool_calls/mean": sum(d["tool_calls"] for d in details) / n,
            "truncated_rate": sum(d["finish"] in ("max_new_tokens", "context") for d in details) / n,
            "dynamic_pool/size": float(len(self.dynamic_pool)),
            "math_verify/timeouts": float(sum(d.get("verify_timed_out", False) for d in details)),
        }

    async def close(self) -> None:
        await super().close()
        if self._verifier_start is not None and not self._verifier_start.done():  # it finishes (bounded): close() stops its workers too
            await asyncio.gather(self._verifier_start, return_exceptions=True)
        self.verifier.close()


def _log_failed_start(start: asyncio.Task[None]) -> None:
    if not start.cancelled() and (err := start.exception()) is not None:
        logger.warning("math-verify's workers could not be started ahead (%s: %s); each check starts one when it needs it", type(err).__name__, err)
