"""inline_math: tool calls inside one open `<think>` block, then a `\\boxed{}` answer.

One rollout is one assistant turn built from token ids:

    prompt ids -> generate until `</tool_call>` -> run the tool -> insert the tool response ids
    (masked) -> generate again from all ids so far -> ... -> `</think>` ... `\\boxed{answer}` EOS

The record holds exactly the ids vLLM sampled (never re-tokenised text) with their logprobs;
the inserted tool responses are masked (-100) and carry no logprob. Generation is bounded by
`max_tool_calls`, `max_new_tokens` and the server's context length.
"""

from __future__ import annotations

import asyncio
import logging
import random
import statistics
from dataclasses import dataclass, field
from typing import Any

from atroposlib.envs.base import ScoredDataGroup

from opd import tracing
from opd.agent.tool_calls import CLOSE, ToolCallError, last_open_call, parse_tool_call
from opd.config import InlineMathEnvConfig, InlineMathRewardConfig
from opd.data.sources import TaskSet
from opd.envs import math_prompt
from opd.envs.base import OPDBaseEnv, Sequence
from opd.records import check_group
from opd.rewards import inline_math as signals
from opd.tools.calculator import CalculatorError, CalculatorLimits, evaluate
from opd.tools.sandbox import SandboxLimits, run_python

logger = logging.getLogger(__name__)


@dataclass
class Rollout:
    """A finished rollout: its aligned token record and what happened in it."""

    sequence: Sequence
    text: str  # the assistant turn, tool responses included, as decoded from its ids
    tool_calls_run: int = 0  # calls that reached a tool (its result may be an error)
    tool_errors: int = 0  # calls whose result is an error: malformed, refused or failed
    finish: str = "eos"  # eos | max_new_tokens | context | tool_after_think
    generated_tokens: int = 0


@dataclass
class Scored:
    score: float
    correct: bool
    signals: dict[str, float] = field(default_factory=dict)
    tool_calls: int = 0


class InlineMathEnv(OPDBaseEnv):
    """The inline_math environment (see module docstring)."""

    name = "inline_math"

    def __init__(
        self,
        cfg: InlineMathEnvConfig,
        reward: InlineMathRewardConfig,
        data: TaskSet,
        *,
        tokenizer_path: str,
        server_configs: list,
        max_model_len: int,
        seed: int,
    ) -> None:
        super().__init__(tokenizer_path, server_configs, cfg.group_size, max_model_len)
        self.cfg = cfg
        self.reward_cfg = reward
        self.data = data
        self.max_model_len = max_model_len
        self.rng = random.Random(seed)
        self._order: list[int] = []
        self.dynamic_pool: list[tuple[str, str]] = []
        self.sandbox_limits = SandboxLimits(
            timeout_s=cfg.sandbox.timeout_s, cpu_s=cfg.sandbox.cpu_s, memory_mb=cfg.sandbox.memory_mb,
            file_size_mb=cfg.sandbox.file_size_mb, max_processes=cfg.sandbox.max_processes,
            output_chars=cfg.sandbox.output_chars, isolate_network=cfg.sandbox.isolate_network, user=cfg.sandbox.user,
        )
        self.calculator_limits = CalculatorLimits(max_chars=cfg.calculator_max_chars)
        self.stop_id = self.tokenizer.convert_tokens_to_ids(CLOSE)

    # ---- items -----------------------------------------------------------------------------

    async def get_next_item(self) -> dict[str, str]:
        """The next training problem: a seeded shuffle of the train split, epoch after epoch."""
        if not self._order:
            self._order = list(range(len(self.data.train)))
            self.rng.shuffle(self._order)
        return self.data.train[self._order.pop()]

    def prompt_ids(self, problem: str, use_pool: bool) -> list[int]:
        shots = list(math_prompt.FEW_SHOTS[: self.cfg.few_shots])
        if use_pool and self.cfg.dynamic_shots and self.dynamic_pool:
            shots += self.dynamic_pool[-self.cfg.dynamic_shots :]
        messages = math_prompt.build_messages(problem + self.cfg.problem_suffix, shots)
        text = self.tokenizer.apply_chat_template(messages, tools=math_prompt.TOOLS, add_generation_prompt=True, tokenize=False)
        return self.tokenizer.encode(text, add_special_tokens=False)

    # ---- one rollout -----------------------------------------------------------------------

    async def run_tool(self, body: str) -> tuple[dict[str, Any], str]:
        """Execute one tool call: (result shown to the model, status).

        status: `ok`; `error` (the tool ran and failed, e.g. division by zero or a Python
        exception); `malformed` (not valid JSON, unknown tool, missing argument: nothing ran).
        """
        try:
            call = parse_tool_call(body)
        except ToolCallError as err:
            return {"error": str(err)}, "malformed"
        if call.name == "calculator":
            expr = call.arguments.get("expr")
            if not isinstance(expr, str):
                return {"error": 'calculator needs an "expr" string'}, "malformed"
            try:
                return {"value": evaluate(expr, self.calculator_limits)}, "ok"
            except CalculatorError as err:
                return {"error": str(err)}, "error"
        if call.name == "python_interpreter":
            code = call.arguments.get("code")
            if not isinstance(code, str):
                return {"error": 'python_interpreter needs a "code" string'}, "malformed"
            result = await run_python(code, self.sandbox_limits)
            return result.as_tool_result(), "ok" if result.error is None else "error"
        return {"error": f"unknown tool {call.name!r}; available: {', '.join(math_prompt.TOOL_NAMES)}"}, "malformed"

    async def rollout(self, prompt_ids: list[int], temperature: float, split: str = "train") -> Rollout:
        """Generate one assistant turn with inline tool calls (see module docstring)."""
        seq = Sequence.from_prompt(prompt_ids)
        rollout = Rollout(seq, "")
        generated_text = ""
        while True:
            budget = min(
                self.cfg.max_tokens_per_segment,
                self.cfg.max_new_tokens - rollout.generated_tokens,
                self.max_model_len - len(seq.tokens),
            )
            if budget <= 0:
                rollout.finish = "max_new_tokens" if rollout.generated_tokens >= self.cfg.max_new_tokens else "context"
                break
            gen = await self.generate(seq.tokens, max_tokens=budget, temperature=temperature, top_p=self.cfg.top_p, stop=[CLOSE], split=split)
            seq.add_generated(gen)
            rollout.generated_tokens += len(gen.token_ids)
            generated_text += self.tokenizer.decode(gen.token_ids, skip_special_tokens=False)
            if gen.finish_reason == "length":
                continue  # the budget check above ends it, or the next segment continues it
            if not gen.token_ids or gen.token_ids[-1] != self.stop_id:
                rollout.finish = "eos"
                break
            # Stopped at </tool_call>: vLLM's ids already end with it; never append it again.
            if "</think>" in generated_text:
                rollout.finish = "tool_after_think"
                break
            body = last_open_call(generated_text)
            if rollout.tool_calls_run >= self.cfg.max_tool_calls:
                result, status = {"error": f"tool call limit ({self.cfg.max_tool_calls}) reached; give the final answer now"}, "refused"
            elif body is None:
                result, status = {"error": "</tool_call> without <tool_call>"}, "malformed"
            else:
                with tracing.span("tool", "TOOL", {"call": body}) as span:
                    result, status = await self.run_tool(body)
                    span.outputs({"result": result, "status": status})
            rollout.tool_calls_run += status in ("ok", "error")
            rollout.tool_errors += status != "ok"
            response = math_prompt.tool_response_text(result)
            seq.add_inserted(self.tokenizer.encode(response, add_special_tokens=False))
            generated_text += response
        rollout.text = generated_text
        return rollout

    def score(self, rollout: Rollout, answer: str) -> Scored:
        w = self.reward_cfg.weights
        outcome = signals.MathOutcome(rollout.text, rollout.tool_calls_run)
        correctness = signals.correctness(outcome, answer, w.correct, w.incorrect, self.reward_cfg.max_answer_chars, self.reward_cfg.verify_timeout_s)
        correct = correctness == w.correct
        values = {
            "correctness": correctness,
            "tool_use": signals.tool_use(outcome, correct, w.tool_use),
            "format": signals.format_violation(outcome, w.format_violation),
        }
        return Scored(sum(values.values()), correct, values, rollout.tool_calls_run)

    # ---- groups ----------------------------------------------------------------------------

    async def collect_trajectories(self, item: dict[str, str]) -> tuple[ScoredDataGroup, list]:
        """`group_size` rollouts of one problem, scored; raises if the group is not valid."""
        prompt = self.prompt_ids(item["problem"], use_pool=True)
        roots = [tracing.start_root("rollout", {"item_id": item["id"], "problem": item["problem"], "index": i}) for i in range(self.cfg.group_size)]

        async def traced(root: Any) -> Rollout:
            with tracing.attach(root):
                return await self.rollout(prompt, self.cfg.temperature)

        try:
            rollouts = await asyncio.gather(*(traced(root) for root in roots))
            scored = [self.score(r, item["answer"]) for r in rollouts]
        except BaseException as err:
            for root in roots:
                tracing.end_root(root, error=err)
            raise
        for root, s in zip(roots, scored):
            tracing.end_root(root, {"score": s.score, "correct": s.correct, "signals": s.signals})
        group = ScoredDataGroup(
            tokens=[r.sequence.tokens for r in rollouts],
            masks=[r.sequence.masks for r in rollouts],
            scores=[s.score for s in scored],
            inference_logprobs=[r.sequence.logprobs for r in rollouts],
            advantages=None,
            ref_logprobs=None,
            messages=None,
            generation_params={"temperature": self.cfg.temperature, "top_p": self.cfg.top_p, "max_new_tokens": self.cfg.max_new_tokens},
            group_overrides={"item_id": item["id"], "answer": item["answer"]},
            overrides=[
                {
                    "reward_signals": s.signals,
                    "correct": s.correct,
                    "tool_calls": r.tool_calls_run,
                    "tool_errors": r.tool_errors,
                    "finish": r.finish,
                    "generated_tokens": r.generated_tokens,
                }
                for r, s in zip(rollouts, scored)
            ],
        )
        problems = check_group(group)
        if problems:
            raise ValueError(f"invalid group for item {item['id']}: {'; '.join(problems[:3])}")
        self._grow_pool(item["problem"], rollouts, scored)
        return group, []

    def _grow_pool(self, problem: str, rollouts: list[Rollout], scored: list[Scored]) -> None:
        if self.cfg.dynamic_pool_size == 0:
            return
        for rollout, result in zip(rollouts, scored):
            if result.correct and rollout.tool_calls_run > 0 and result.signals["format"] == 0:
                self.dynamic_pool.append((problem, rollout.text))
                del self.dynamic_pool[: -self.cfg.dynamic_pool_size]
                break

    def group_metrics(self, group: dict[str, Any]) -> dict[str, float]:
        details = group["overrides"]
        n = len(details)
        return {
            **super().group_metrics(group),
            "accuracy": sum(d["correct"] for d in details) / n,
            "tool_use_rate": sum(d["tool_calls"] > 0 for d in details) / n,
            "tool_calls/mean": sum(d["tool_calls"] for d in details) / n,
            "truncated_rate": sum(d["finish"] in ("max_new_tokens", "context") for d in details) / n,
            "dynamic_pool/size": float(len(self.dynamic_pool)),
        }

    # ---- evaluation ------------------------------------------------------------------------

    async def evaluate(self, *args: Any, concurrency: int = 8, **kwargs: Any) -> dict[str, float]:
        """One rollout per held-out problem with the training protocol (tools, few-shots), at
        `eval_temperature`, without the dynamic pool. Failed rollouts are counted, not hidden."""
        semaphore = asyncio.Semaphore(concurrency)

        async def one(item: dict[str, str]) -> Scored | None:
            async with semaphore:
                try:
                    rollout = await self.rollout(self.prompt_ids(item["problem"], use_pool=False), self.cfg.eval_temperature, split="eval")
                except Exception as err:
                    logger.warning("eval item %s failed: %s", item["id"], err)
                    return None
                return self.score(rollout, item["answer"])

        results = await asyncio.gather(*(one(item) for item in self.data.eval))
        done = [r for r in results if r is not None]
        n = max(1, len(done))
        return {
            "eval/accuracy": sum(r.correct for r in done) / n,
            "eval/reward_mean": statistics.fmean([r.score for r in done]) if done else 0.0,
            "eval/tool_use_rate": sum(r.tool_calls > 0 for r in done) / n,
            "eval/format_violation_rate": sum(r.signals["format"] < 0 for r in done) / n,
            "eval/items": float(len(results)),
            "eval/failed_items": float(len(results) - len(done)),
        }
