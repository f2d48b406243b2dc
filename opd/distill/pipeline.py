"""On-policy distillation for one group: judge every turn pair, score hinted turns, build arrays.

All pairs of all sequences run concurrently under one semaphore (`max_concurrency` judge or
scoring requests in flight). Every failure is counted and logged once per cause; a pair whose
judge or scoring failed simply carries no teacher rows, and the record says why.

Output per sequence (see docs/records.md, "OPD fields"):
- `distill_token_ids` / `distill_logprobs` [pos][K]: the teacher's top-K sorted by logprob on the
  positions of hinted, scored turns; elsewhere K pads (`DISTILL_PAD_ID`, `DISTILL_PAD_LOGPROB`).
- `overrides["teacher_logprobs"]` [pos]: the teacher's logprob of the token the student sampled
  (null without a teacher row); the student's own is `inference_logprobs`.
- `overrides["opd_turns"]`: per judged turn: span, votes, decision, hint, scored, error, and the
  votes that failed, were cut off at max_tokens, or held a hint the policy planted (counts).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from opd.agent.loop import AgentRollout
from opd.config import JudgeConfig, OPDConfig
from opd.distill.judge import ChatFn, judge_pair
from opd.distill.teacher import ScoreFn, TeacherRows, score_turn
from opd.distill.turn_pairs import TurnPair, turn_pairs
from opd.records import DISTILL_PAD_ID, DISTILL_PAD_LOGPROB
from opd.tracking.traces import Tracer

logger = logging.getLogger(__name__)


class FailureLog:
    """Counts OPD failures by cause; logs the first of each cause at WARNING with a sample."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def record(self, kind: str, err: BaseException) -> str:
        cause = f"{kind}: {type(err).__name__}"
        text = f"{type(err).__name__}: {str(err)[:300]}"
        if cause not in self.counts:
            logger.warning("OPD %s failed (counted in the opd/* metrics; later failures of this kind are not logged): %s", kind, text)
        self.counts[cause] = self.counts.get(cause, 0) + 1
        return text


@dataclass(frozen=True)
class JudgedPair:
    """One turn pair after the judge (and, if hinted, the teacher): its record and its rows."""

    seq_index: int
    pair: TurnPair
    record: dict[str, Any]
    rows: TeacherRows | None


async def judge_and_score(seq_index: int, pair: TurnPair, ids: list[int], prompt_len: int, *, tokenizer: Any, tools: list[dict] | None,
                          chat: ChatFn, score: ScoreFn, opd: OPDConfig, judge: JudgeConfig, failures: FailureLog, semaphore: asyncio.Semaphore,
                          template_kwargs: dict[str, Any] | None = None) -> JudgedPair:
    """Judge one pair; if the judge gives a hint, score the turn's ids with the hinted teacher
    (`ids`: the sequence's ids up to the turn's end; `prompt_len`: how many of them are the prompt)."""
    record: dict[str, Any] = {
        "span": [pair.span.start, pair.span.end],
        "message_index": pair.span.message_index,  # the turn in `messages`; its context is what precedes it
        "next_state_role": pair.next_state_role,
    }
    try:
        async with semaphore:
            judgement = await judge_pair(pair, chat, judge)
    except Exception as err:
        record.update(votes=[], votes_failed=judge.votes, votes_cut_off=0, hints_planted=0, decision=None, hint=None, scored=False,
                      error=failures.record("judge", err))
        return JudgedPair(seq_index, pair, record, None)
    record.update(votes=[v.decision for v in judgement.votes], votes_failed=judgement.failed, votes_cut_off=judgement.cut_off,
                  hints_planted=judgement.planted, decision=judgement.decision, hint=judgement.hint, scored=False, error=None)
    if judgement.hint is None:
        return JudgedPair(seq_index, pair, record, None)
    try:
        async with semaphore:
            rows = await score_turn(tokenizer, pair.context, tools, ids[pair.span.start : pair.span.end], judgement.hint, opd.hint_placement, opd.topk, score,
                                    template_kwargs, opd.hint_header, context_ids=ids[: pair.span.start], prompt_len=prompt_len)
    except Exception as err:
        record["error"] = failures.record("teacher scoring", err)
        return JudgedPair(seq_index, pair, record, None)
    record["scored"] = True
    return JudgedPair(seq_index, pair, record, rows)


def distill_fields(rollouts: list[AgentRollout], judged: list[JudgedPair], top_k: int, base: list[TeacherRows] | None = None) -> dict[str, Any]:
    """The group's `distill_*` arrays (pads where no teacher row) and per-sequence additions;
    `base`: rows already on every sampled token (teacher=model), which hinted turns' rows replace."""
    token_ids: list[list[list[int]]] = []
    logprobs: list[list[list[float]]] = []
    teacher_lps: list[list[float | None]] = []
    for i, rollout in enumerate(rollouts):
        n = len(rollout.sequence.tokens)
        if base is not None:
            token_ids.append(list(base[i].token_ids))
            logprobs.append(list(base[i].logprobs))
            teacher_lps.append(list(base[i].sampled_logprobs))
            continue
        token_ids.append([[DISTILL_PAD_ID] * top_k for _ in range(n)])
        logprobs.append([[DISTILL_PAD_LOGPROB] * top_k for _ in range(n)])
        teacher_lps.append([None] * n)
    turns: list[list[dict[str, Any]]] = [[] for _ in rollouts]
    for item in judged:
        turns[item.seq_index].append(item.record)
        if item.rows is None:
            continue
        for offset, position in enumerate(range(item.pair.span.start, item.pair.span.end)):
            token_ids[item.seq_index][position] = item.rows.token_ids[offset]
            logprobs[item.seq_index][position] = item.rows.logprobs[offset]
            teacher_lps[item.seq_index][position] = item.rows.sampled_logprobs[offset]
    return {
        "distill_token_ids": token_ids,
        "distill_logprobs": logprobs,
        "overrides": [{"opd_turns": t, "teacher_logprobs": lp} for t, lp in zip(turns, teacher_lps)],
    }


async def apply_opd(
    rollouts: list[AgentRollout],
    *,
    tokenizer: Any,
    tools: list[dict] | None,
    chat: ChatFn,
    score: ScoreFn,
    opd: OPDConfig,
    judge: JudgeConfig,
    failures: FailureLog,
    tracer: Tracer,
    trace_roots: list[Any] | None = None,
    template_kwargs: dict[str, Any] | None = None,
    base: list[TeacherRows] | None = None,
) -> dict[str, Any]:
    """Fields to merge into the group (`distill_*` arrays, per-sequence override additions);
    `template_kwargs`: the chat-template arguments the rollouts were rendered with; `base`: a
    teacher model's rows on every sampled token, kept where no hinted turn replaces them."""
    semaphore = asyncio.Semaphore(opd.max_concurrency)
    pairs = [(i, pair) for i, r in enumerate(rollouts) for pair in turn_pairs(r, opd.max_state_chars, opd.max_response_chars, opd.response_cut)]

    async def one(seq_index: int, pair: TurnPair) -> JudgedPair:
        rollout = rollouts[seq_index]
        ids = rollout.sequence.tokens[: pair.span.end]
        with tracer.attach(trace_roots[seq_index] if trace_roots else None):
            return await judge_and_score(seq_index, pair, ids, rollout.turns[0].start, tokenizer=tokenizer, tools=tools, chat=chat, score=score,
                                         opd=opd, judge=judge, failures=failures, semaphore=semaphore,
                                         template_kwargs=template_kwargs)

    judged = await asyncio.gather(*(one(i, p) for i, p in pairs))
    return distill_fields(rollouts, list(judged), opd.topk, base)
