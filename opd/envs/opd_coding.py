"""opd_coding: an agent writes code with file and terminal tools; OPD from hindsight hints.

Per group: `group_size` rollouts of one task, each in its own sandbox directory holding the
task's tests (`test_solution.py`). The reward runs the task's tests itself on the agent's
`solution.py`. Then, with `env.opd.enabled`, every assistant turn that has a next state is
judged; a hinted turn is scored by the same model given the hint (`opd.distill`), and the
group carries the teacher's top-K rows on that turn's tokens.
"""

from __future__ import annotations

import asyncio
import logging
import random
import statistics
import time
from typing import Any

from atroposlib.envs.base import ScoredDataGroup

from opd import tracing
from opd.agent.loop import AgentRollout, run_agent
from opd.config import ConfigError, JudgeConfig, OPDCodingEnvConfig, OPDCodingRewardConfig
from opd.data.sources import TaskSet
from opd.distill.pipeline import FailureLog, OPDSettings, apply_opd
from opd.envs import coding_prompt
from opd.envs.base import OPDBaseEnv, unwrap_retry
from opd.records import MASK, check_group
from opd.rewards import coding as signals
from opd.serving.vllm_client import ServerRequestError
from opd.tools.sandbox import SandboxLimits
from opd.tools.workspace import Workspace

logger = logging.getLogger(__name__)


def _limits(cfg: Any, timeout_s: float | None = None) -> SandboxLimits:
    return SandboxLimits(
        timeout_s=timeout_s or cfg.timeout_s, cpu_s=cfg.cpu_s, memory_mb=cfg.memory_mb, file_size_mb=cfg.file_size_mb,
        max_processes=cfg.max_processes, output_chars=cfg.output_chars, isolate_network=cfg.isolate_network, user=cfg.user,
    )


class OPDCodingEnv(OPDBaseEnv):
    """The opd_coding environment (see module docstring)."""

    name = "opd_coding"

    def __init__(
        self,
        cfg: OPDCodingEnvConfig,
        reward: OPDCodingRewardConfig,
        judge: JudgeConfig,
        data: TaskSet,
        *,
        tokenizer_path: str,
        server_configs: list,
        max_model_len: int,
        seed: int,
        judge_server: Any = None,
    ) -> None:
        super().__init__(tokenizer_path, server_configs, cfg.group_size, max_model_len)
        self.cfg, self.reward_cfg, self.judge_cfg, self.data = cfg, reward, judge, data
        self.max_model_len = max_model_len
        self.rng = random.Random(seed)
        self._order: list[int] = []
        self.system_prompt = cfg.system_prompt or coding_prompt.SYSTEM_PROMPT
        self.judge_server = judge_server if judge_server is not None else self.server
        self.failures = FailureLog()
        self.opd_settings = OPDSettings(
            top_k=cfg.opd.topk, votes=judge.votes, judge_max_tokens=judge.max_tokens, judge_temperature=judge.temperature,
            decision_rule=judge.decision_rule, min_hint_chars=judge.min_hint_chars, hint_choice=judge.hint_choice,
            hint_placement=cfg.opd.hint_placement, max_state_chars=cfg.opd.max_state_chars,
            max_response_chars=cfg.opd.max_response_chars, max_concurrency=cfg.opd.max_concurrency,
        )

    async def setup(self) -> None:
        """Fail before generating if the server cannot return top-K = `distill_topk` rows."""
        if not self.cfg.opd.enabled:
            return
        probe = self.tokenizer.encode("hello world", add_special_tokens=False)
        try:
            await self.score_prompt(probe, self.cfg.opd.topk)
        except ServerRequestError as err:
            if err.status == 400:
                raise ConfigError(
                    f"distill_topk={self.cfg.opd.topk} is refused by the inference server (is it above the server's "
                    f"--max-logprobs? server.max_logprobs is the local server's setting): {err}"
                ) from None
            raise

    async def get_next_item(self) -> dict[str, str]:
        if not self._order:
            self._order = list(range(len(self.data.train)))
            self.rng.shuffle(self._order)
        return self.data.train[self._order.pop()]

    # ---- server calls used by OPD ----------------------------------------------------------

    async def score_prompt(self, input_ids: list[int], top_k: int, rows_from: int = 0) -> dict[str, Any]:
        with tracing.span("teacher scoring", "LLM", {"tokens": len(input_ids), "top_k": top_k}):
            try:
                return await self.server.get_logprobs(input_ids=input_ids, top_k=top_k, rows_from=rows_from, split="eval")
            except Exception as err:
                raise unwrap_retry(err) from None

    async def judge_chat(self, messages: list[dict[str, str]], n: int, max_tokens: int, temperature: float) -> list[str]:
        async def one(count: int) -> list[str]:
            with tracing.span("judge", "LLM", {"messages": messages, "votes": count}) as span:
                try:
                    completion = await self.judge_server.chat_completion(messages=messages, n=count, max_tokens=max_tokens, temperature=temperature, split="eval")
                except Exception as err:
                    raise unwrap_retry(err) from None
                texts = [choice.message.content or "" for choice in completion.choices]
                span.outputs(texts)
            return texts

        if self.judge_cfg.votes_in_one_request:
            return await one(n)
        return [text for texts in await asyncio.gather(*(one(1) for _ in range(n))) for text in texts]

    # ---- one rollout -----------------------------------------------------------------------

    async def rollout(self, task: dict[str, str], temperature: float, split: str = "train") -> tuple[AgentRollout, dict[str, Any]]:
        """Run the agent in a fresh sandbox; return the rollout and its scored details."""
        workspace = Workspace(_limits(self.cfg.sandbox), self.cfg.max_file_chars)
        try:
            workspace.write_file(coding_prompt.TEST_FILE, task["test_code"])
            rollout = await run_agent(
                tokenizer=self.tokenizer,
                messages=coding_prompt.initial_messages(task["task"], self.system_prompt),
                tools=coding_prompt.TOOLS,
                generate=self.generate,
                run_tool=workspace.call,
                allowed_tools=coding_prompt.TOOL_NAMES,
                max_turns=self.cfg.max_turns,
                max_tokens_per_turn=self.cfg.max_tokens_per_turn,
                max_model_len=self.max_model_len,
                temperature=temperature,
                top_p=self.cfg.top_p,
                split=split,
            )
            with tracing.span("task tests", "TOOL") as span:
                outcome = await signals.run_task_tests(workspace.root, task["test_code"], _limits(self.cfg.sandbox, self.reward_cfg.tests_timeout_s))
                span.outputs(outcome.level)
        finally:
            workspace.close()
        return rollout, self.score(rollout, outcome)

    def score(self, rollout: AgentRollout, outcome: signals.TestOutcome) -> dict[str, Any]:
        r = self.reward_cfg
        levels = {"pass": r.correctness_levels.passed, "assertion": r.correctness_levels.assertion,
                  "crash": r.correctness_levels.crash, "nothing_written": r.correctness_levels.nothing_written}
        values = {
            "correctness": signals.correctness(outcome, levels),
            "efficiency": signals.efficiency(rollout.turns_used, self.cfg.max_turns, r.efficiency.best_turns, r.efficiency.steps, r.efficiency.floor),
            "tool_usage": signals.tool_usage(rollout.tools_used, r.tool_usage.write_and_run, r.tool_usage.run_only, r.tool_usage.other),
        }
        score = r.weights.correctness * values["correctness"] + r.weights.efficiency * values["efficiency"] + r.weights.tool_usage * values["tool_usage"]
        return {
            "score": score,
            "reward_signals": values,
            "tests": outcome.level,
            "turns": rollout.turns_used,
            "tools_used": rollout.tools_used,
            "tool_errors": rollout.tool_errors,
            "finish": rollout.finish,
            "generated_tokens": sum(t.end - t.start for t in rollout.turns),
        }

    # ---- groups ----------------------------------------------------------------------------

    async def collect_trajectories(self, item: dict[str, str]) -> tuple[ScoredDataGroup, list]:
        roots = [tracing.start_root("rollout", {"item_id": item["id"], "task": item["task"], "index": i}) for i in range(self.cfg.group_size)]
        try:
            group = await self._collect(item, roots)
        except BaseException as err:
            for root in roots:
                tracing.end_root(root, error=err)
            raise
        for root, score, detail in zip(roots, group["scores"], group["overrides"]):
            tracing.end_root(root, {"score": score, "tests": detail["tests"], "turns": detail["turns"]})
        return group, []

    async def _collect(self, item: dict[str, str], roots: list[Any]) -> ScoredDataGroup:
        async def traced(root: Any) -> tuple[AgentRollout, dict[str, Any]]:
            with tracing.attach(root):
                return await self.rollout(item, self.cfg.temperature)

        results = await asyncio.gather(*(traced(root) for root in roots))
        rollouts = [r for r, _ in results]
        details = [d for _, d in results]
        group = ScoredDataGroup(
            tokens=[r.sequence.tokens for r in rollouts],
            masks=[r.sequence.masks for r in rollouts],
            scores=[d.pop("score") for d in details],
            inference_logprobs=[r.sequence.logprobs for r in rollouts],
            advantages=None,
            ref_logprobs=None,
            # The chat as the template saw it (assistant turns as sampled text): enough to rebuild
            # every judge prompt and teacher context from the file alone.
            messages=[r.messages for r in rollouts],
            generation_params={"temperature": self.cfg.temperature, "top_p": self.cfg.top_p, "max_tokens_per_turn": self.cfg.max_tokens_per_turn},
            group_overrides={"item_id": item["id"]},
            overrides=details,
        )
        if self.cfg.opd.enabled:
            started = time.monotonic()
            fields = await apply_opd(
                rollouts, tokenizer=self.tokenizer, tools=coding_prompt.TOOLS, chat=self.judge_chat,
                score=self.score_prompt, settings=self.opd_settings, failures=self.failures, trace_roots=roots,
            )
            group["group_overrides"]["opd_wall_s"] = round(time.monotonic() - started, 3)
            group["distill_token_ids"] = fields["distill_token_ids"]
            group["distill_logprobs"] = fields["distill_logprobs"]
            for detail, extra in zip(details, fields["overrides"]):
                detail.update(extra)
        problems = check_group(group)
        if problems:
            raise ValueError(f"invalid group for item {item['id']}: {'; '.join(problems[:3])}")
        return group

    def group_metrics(self, group: dict[str, Any]) -> dict[str, float]:
        details = group["overrides"]
        n = len(details)
        metrics = {
            **super().group_metrics(group),
            "accuracy": sum(d["tests"] == "pass" for d in details) / n,
            "turns/mean": sum(d["turns"] for d in details) / n,
            "tool_use_rate": sum(bool(d["tools_used"]) for d in details) / n,
        }
        if "opd_turns" in details[0]:
            metrics.update(opd_metrics(group))
            metrics["opd/wall_s"] = float(group["group_overrides"].get("opd_wall_s", 0.0))
        return metrics

    # ---- evaluation ------------------------------------------------------------------------

    async def evaluate(self, *args: Any, concurrency: int = 8, **kwargs: Any) -> dict[str, float]:
        """One rollout per held-out task at `eval_temperature` (greedy by default), no OPD."""
        semaphore = asyncio.Semaphore(concurrency)

        async def one(task: dict[str, str]) -> dict[str, Any] | None:
            async with semaphore:
                try:
                    return (await self.rollout(task, self.cfg.eval_temperature, split="eval"))[1]
                except Exception as err:
                    logger.warning("eval task %s failed: %s", task["id"], err)
                    return None

        results = await asyncio.gather(*(one(t) for t in self.data.eval))
        done = [r for r in results if r is not None]
        n = max(1, len(done))
        return {
            "eval/accuracy": sum(r["tests"] == "pass" for r in done) / n,
            "eval/reward_mean": statistics.fmean([r["score"] for r in done]) if done else 0.0,
            "eval/turns_mean": sum(r["turns"] for r in done) / n,
            "eval/items": float(len(results)),
            "eval/failed_items": float(len(results) - len(done)),
        }


def opd_metrics(group: dict[str, Any]) -> dict[str, float]:
    """OPD counters of one group, computed from what the records say (nothing hidden in state)."""
    records = [t for d in group["overrides"] for t in d["opd_turns"]]
    judged = [t for t in records if t["decision"] is not None or t["votes"]]
    hinted = [t for t in records if t["hint"]]
    diffs = [
        teacher - student
        for d, lps, masks in zip(group["overrides"], group["inference_logprobs"], group["masks"])
        for teacher, student, mask in zip(d["teacher_logprobs"], lps, masks)
        if teacher is not None and mask != MASK
    ]
    n = len(group["overrides"])
    return {
        "opd/pairs": float(len(records)),
        "opd/pairs_judged": float(len(judged)),
        "opd/judge_failures": float(sum(1 for t in records if not t["votes"] and t["error"])),
        "opd/votes_unparseable": float(sum(v is None for t in records for v in t["votes"])),
        "opd/hint_rate": len(hinted) / len(judged) if judged else 0.0,
        "opd/hints_per_rollout": len(hinted) / n,
        "opd/turns_scored": float(sum(t["scored"] for t in records)),
        "opd/scoring_failures": float(sum(1 for t in hinted if not t["scored"])),
        "opd/teacher_minus_student_lp": statistics.fmean(diffs) if diffs else 0.0,
    }
