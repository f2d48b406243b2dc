"""opd_coding: an agent writes code with file and terminal tools; OPD from hindsight hints.

Per group: `group_size` rollouts of one task, each in its own sandbox directory holding the
task's tests (`test_solution.py`). The reward runs the task's tests itself on the agent's
`solution.py`. Then, with `env.opd.enabled`, every assistant turn that has a next state is
judged; a hinted turn is scored by the same model given the hint (`opd.distill`), and the
group carries the teacher's top-K rows on that turn's tokens.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from opd import latency
from opd.agent.loop import AgentLimits, AgentRollout, run_agent
from opd.config import ConfigError, JudgeConfig, OPDCodingEnvConfig, OPDCodingRewardConfig
from opd.distill.judge_tokens import judge_defuser
from opd.distill.pipeline import FailureLog, apply_opd
from opd.distill.teacher import TeacherRows
from opd.envs import coding_prompt
from opd.envs.base import RolloutEnv, RolloutResult
from opd.records import MASK
from opd.rewards import coding as rewards
from opd.serving.pool import ServerPool
from opd.serving.vllm_client import ChatReply, PromptScores, ServerRequestError
from opd.tools import workspace as workspace_tools
from opd.tools.registry import Toolbox
from opd.tools.workspace import Workspace

if TYPE_CHECKING:
    from atroposlib.envs.base import ScoredDataGroup


class OPDCodingEnv(RolloutEnv):
    """The opd_coding environment (see module docstring)."""

    name = "opd_coding"
    # The whole score from reward=<env> (checked before any server starts: opd.build.preflight).
    build_rubric = staticmethod(rewards.rubric)
    # The record keeps a turn's token budget.
    budget_fields = ("max_tokens_per_turn",)
    # The tools the agent is shown.
    tool_schemas = coding_prompt.TOOLS

    def __init__(self, cfg: OPDCodingEnvConfig, reward: OPDCodingRewardConfig, judge: JudgeConfig, judge_pool: ServerPool | None = None, **common: Any) -> None:
        super().__init__(cfg, reward, **common)
        self.reward_cfg, self.judge_cfg = reward, judge
        self.system_prompt = cfg.system_prompt or coding_prompt.SYSTEM_PROMPT
        self.judge_pool = judge_pool or self.server
        # The server tokenizes the judge's prompt itself: what it quotes is defused for the judge's
        # own tokenizer (judge=server: another family's, opd.distill.judge_tokens) and the policy's.
        self.judge_defuse = judge_defuser(judge, self.tokenizer)
        self.limits = AgentLimits(cfg.max_turns, cfg.max_tokens_per_turn, self.max_model_len)
        self.failures = FailureLog()

    def request_pools(self) -> list[Any]:
        """The policy's, teacher=model's and, with judge=server, the judge's."""
        return [*super().request_pools(), *([self.judge_pool] if self.judge_pool is not self.server else [])]

    async def setup(self) -> None:
        """Fail before generating if the server cannot return top-K = `distill_topk` rows."""
        await super().setup()
        if not self.cfg.opd.enabled or self.teacher is not None:
            return  # a teacher model's top-K is probed on its own server (RolloutEnv.setup)
        probe = self.tokenizer.encode("hello world", add_special_tokens=False)
        try:
            await self.server.score(probe, self.cfg.opd.topk)
        except ServerRequestError as err:
            if err.status == 400:
                raise ConfigError(
                    f"distill_topk={self.cfg.opd.topk} is refused by the inference server (is it above the server's "
                    f"--max-logprobs? server.max_logprobs is the local server's setting): {err}", "distill_topk",
                ) from None
            raise

    # ---- server calls used by OPD ----------------------------------------------------------

    async def score_prompt(self, input_ids: list[int], top_k: int, rows_from: int = 0) -> PromptScores:
        with self.tracer.span("teacher scoring", "LLM", {"tokens": len(input_ids), "top_k": top_k}):
            return await self.server.score(input_ids, top_k, rows_from)

    async def judge_chat(self, messages: list[dict[str, str]], n: int, max_tokens: int, temperature: float) -> list[ChatReply | None]:
        """`n` vote replies; None for a vote whose request failed. Raises only when every vote failed."""
        # The policy judging itself gets the preset's template arguments (thinking on or off).
        extra = {"chat_template_kwargs": dict(self.chat_format.template_kwargs)} if self.judge_pool is self.server and self.chat_format.template_kwargs else {}
        # The server tokenizes the judge's prompt itself: a turn or a tool's output that holds a
        # control token's text must not become that token there.
        messages = [{**m, "content": self.judge_defuse(m["content"])} if isinstance(m.get("content"), str) else m for m in messages]

        async def one(count: int) -> list[ChatReply | None]:
            with self.tracer.span("judge", "LLM", {"messages": messages, "votes": count}) as span:
                replies = await self.judge_pool.chat(messages, n=count, max_tokens=max_tokens, temperature=temperature, **extra)
                span.outputs([{"text": r.text, "finish_reason": r.finish_reason} for r in replies])
            return list(replies)

        if self.judge_cfg.votes_in_one_request:
            try:
                return await one(n)
            except ServerRequestError:
                if not self.judge_cfg.retry_votes_alone:
                    raise
        # One request per vote: a vote that fails is None (unparseable, as in the reference), unless all do.
        answers = await asyncio.gather(*(one(1) for _ in range(n)), return_exceptions=True)
        errors = [a for a in answers if isinstance(a, BaseException)]
        if len(errors) == n:
            raise errors[0]
        for error in errors:
            self.failures.record("judge vote", error)
        return [None if isinstance(a, BaseException) else a[0] for a in answers]

    # ---- one rollout -----------------------------------------------------------------------

    async def rollout(self, item: dict[str, Any], temperature: float, prepared: Any) -> RolloutResult:
        """Run the agent in a fresh sandbox, then the task's tests (`tests`: how they ended); whether
        the rollout passed is the rubric's (correctness >= reward.pass_threshold)."""
        workspace = Workspace(self.cfg.sandbox, self.cfg.max_file_chars)
        try:
            workspace.write_file(coding_prompt.TEST_FILE, item["test_code"])
            rollout = await run_agent(
                tokenizer=self.tokenizer,
                messages=coding_prompt.initial_messages(item["task"], self.system_prompt, item["test_code"] if self.cfg.show_tests else None),
                toolbox=Toolbox(workspace_tools.TOOLS, workspace),
                generate=self.generate,
                limits=self.limits,
                temperature=temperature,
                tracer=self.tracer,
                fmt=self.chat_format,
                parser=self.parser,
            )
            with self.tracer.span("task tests", "TOOL") as span, latency.phase("reward"):
                tests = await rewards.run_task_tests(workspace, item["test_code"], replace(self.cfg.sandbox, timeout_s=self.reward_cfg.tests_timeout_s),
                                                     self.reward_cfg.max_solution_chars)
                span.outputs(tests.level)
        finally:
            await workspace.close()
        scored = self.rubric.score(rewards.CodingOutcome(tests.level, rollout.turns_used, self.cfg.max_turns, tuple(rollout.tools_used)))
        # The chat as the template saw it (assistant turns as sampled text): enough to rebuild
        # every judge prompt and teacher context from the file alone.
        result = RolloutResult(
            rollout.sequence, scored, rollout.finish, len(rollout.tools_used), rollout.tool_errors, rollout.generated_tokens,
            rollout.messages, {"tests": tests.level, "turns": rollout.turns_used, "tools_used": rollout.tools_used},
            prompt=item["task"], response="\n\n".join(f"[{m['role']}] {m['content']}" for m in rollout.messages[2:]), turns=rollout.turns_used,
            eval_metrics={"turns_mean": float(rollout.turns_used)}, state=rollout,
        )
        result.eval_metrics["pass_rate"] = float(self.passed(result))  # the reference's eval/pass_rate: the one verdict
        return result

    # ---- groups ----------------------------------------------------------------------------

    async def finish_group(self, group: ScoredDataGroup, item: dict[str, Any], results: list[RolloutResult], roots: list[Any],
                           rows: list[TeacherRows] | None) -> None:
        """With env.opd.enabled, the judge's hints and the teacher's rows on hinted turns."""
        if self.cfg.opd.enabled:
            with latency.phase("opd"):
                await self._distill(group, [r.state for r in results], roots, rows)

    async def _distill(self, group: ScoredDataGroup, rollouts: list[AgentRollout], roots: list[Any], base: list[TeacherRows] | None = None) -> None:
        """Judge the group's turn pairs, score hinted turns (by the policy given the hint, or with
        teacher=model by the teacher given it, over `base`, its rows on every token), and add the
        teacher's rows to the group."""
        started = time.monotonic()
        fields = await apply_opd(
            rollouts, tokenizer=self.tokenizer, tools=coding_prompt.TOOLS, chat=self.judge_chat,
            score=self.teacher.score if self.teacher is not None else self.score_prompt,
            opd=self.cfg.opd, judge=self.judge_cfg, failures=self.failures, tracer=self.tracer, trace_roots=roots,
            template_kwargs=self.chat_format.render_kwargs, base=base,
        )
        group["group_overrides"]["opd_wall_s"] = round(time.monotonic() - started, 3)
        group["distill_token_ids"] = fields["distill_token_ids"]
        group["distill_logprobs"] = fields["distill_logprobs"]
        for detail, extra in zip(group["overrides"], fields["overrides"]):
            detail.update(extra)

    def env_metrics(self, group: dict[str, Any]) -> dict[str, float]:
        details = group["overrides"]
        n = len(details)
        metrics = {
            # The reference's pass rate: rollouts that passed (correctness >= reward.pass_threshold), as recorded.
            "train/pass_rate": sum(bool(d["passed"]) for d in details) / n,
            "turns/mean": sum(d["turns"] for d in details) / n,
            "tool_use_rate": sum(bool(d["tools_used"]) for d in details) / n,
        }
        if "opd_turns" in details[0]:
            metrics.update(opd_metrics(group))
            metrics["opd/wall_s"] = float(group["group_overrides"].get("opd_wall_s", 0.0))
        return metrics

    async def close(self) -> None:
        await super().close()
        if self.judge_pool is not self.server:
            await self.judge_pool.close()


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
        # Votes whose request failed after the pool's retries (a failed judging counts all its votes).
        "opd/votes_failed": float(sum(t.get("votes_failed", 0) for t in records)),
        # Votes cut off at judge.max_tokens (discarded: they may stop inside a quote).
        "opd/votes_cut_off": float(sum(t.get("votes_cut_off", 0) for t in records)),
        # Votes discarded because their hint is one the policy wrote between hint markers in the turn or the state.
        "opd/hints_planted": float(sum(t.get("hints_planted", 0) for t in records)),
        # The reference's hint rate: the fraction of rollouts with at least one hint.
        "opd/hint_rate": sum(any(t["hint"] for t in d["opd_turns"]) for d in group["overrides"]) / n,
        # Hinted pairs per judged pair (this project's earlier opd/hint_rate).
        "opd/pair_hint_rate": len(hinted) / len(judged) if judged else 0.0,
        "opd/hints_per_rollout": len(hinted) / n,
        "opd/turns_scored": float(sum(t["scored"] for t in records)),
        "opd/mean_turns_scored": sum(t["scored"] for t in records) / n,
        "opd/scoring_failures": float(sum(1 for t in hinted if not t["scored"])),
        "opd/teacher_minus_student_lp": statistics.fmean(diffs) if diffs else 0.0,
    }
