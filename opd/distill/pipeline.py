"""On-policy distillation for one group: judge every turn pair, score hinted turns, build arrays.

All pairs of all sequences run concurrently under one semaphore (`max_concurrency` judge or
scoring requests in flight). Every failure is counted and logged once per cause; a pair whose
judge or scoring failed simply carries no teacher rows, and the record says why.

Output per sequence (see the README, "OPD fields"):
- `distill_token_ids` / `distill_logprobs` [pos][K]: the teacher's top-K sorted by logprob on the
  positions of hinted, scored turns; elsewhere K pads (`DISTILL_PAD_ID`, `DISTILL_PAD_LOGPROB`).
- `overrides["teacher_logprobs"]` [pos]: the teacher's logprob of the token the student sampled
  (null without a teacher row); the student's own is `inference_logprobs`.
- `overrides["opd_turns"]`: per judged turn: span, votes, decision, hint, scored, error.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from opd import tracing
from opd.agent.loop import AgentRollout
from opd.distill.judge import ChatFn, judge_pair
from opd.distill.teacher import ScoreFn, score_turn
from opd.distill.turn_pairs import TurnPair, turn_pairs
from opd.records import DISTILL_PAD_ID, DISTILL_PAD_LOGPROB

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class OPDSettings:
    top_k: int
    votes: int
    judge_max_tokens: int
    judge_temperature: float
    decision_rule: str
    min_hint_chars: int
    hint_choice: str
    hint_placement: str
    max_state_chars: int
    max_response_chars: int
    max_concurrency: int


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


async def apply_opd(
    rollouts: list[AgentRollout],
    *,
    tokenizer: Any,
    tools: list[dict] | None,
    chat: ChatFn,
    score: ScoreFn,
    settings: OPDSettings,
    failures: FailureLog,
    trace_roots: list[Any] | None = None,
) -> dict[str, Any]:
    """Fields to merge into the group (`distill_*` arrays, per-sequence override additions)."""
    semaphore = asyncio.Semaphore(settings.max_concurrency)
    pairs = [(i, pair) for i, r in enumerate(rollouts) for pair in turn_pairs(r, settings.max_state_chars, settings.max_response_chars)]

    async def one(seq_index: int, pair: TurnPair) -> tuple[int, TurnPair, dict[str, Any], Any]:
        with tracing.attach(trace_roots[seq_index] if trace_roots else None):
            return await judge_and_score(seq_index, pair)

    async def judge_and_score(seq_index: int, pair: TurnPair) -> tuple[int, TurnPair, dict[str, Any], Any]:
        record: dict[str, Any] = {
            "span": [pair.span.start, pair.span.end],
            "message_index": pair.span.message_index,  # the turn in `messages`; its context is what precedes it
            "next_state_role": pair.next_state_role,
        }
        try:
            async with semaphore:
                judgement = await judge_pair(
                    pair, chat, votes=settings.votes, max_tokens=settings.judge_max_tokens, temperature=settings.judge_temperature,
                    rule=settings.decision_rule, min_hint_chars=settings.min_hint_chars, hint_choice=settings.hint_choice,
                )
        except Exception as err:
            record.update(votes=[], decision=None, hint=None, scored=False, error=failures.record("judge", err))
            return seq_index, pair, record, None
        record.update(votes=[v.decision for v in judgement.votes], decision=judgement.decision, hint=judgement.hint, scored=False, error=None)
        if judgement.hint is None:
            return seq_index, pair, record, None
        turn_ids = rollouts[seq_index].sequence.tokens[pair.span.start : pair.span.end]
        try:
            async with semaphore:
                rows = await score_turn(tokenizer, pair.context, tools, turn_ids, judgement.hint, settings.hint_placement, settings.top_k, score)
        except Exception as err:
            record["error"] = failures.record("teacher scoring", err)
            return seq_index, pair, record, None
        record["scored"] = True
        return seq_index, pair, record, rows

    results = await asyncio.gather(*(one(i, p) for i, p in pairs))
    k = settings.top_k
    token_ids: list[list[list[int]]] = []
    logprobs: list[list[list[float]]] = []
    teacher_lps: list[list[float | None]] = []
    for rollout in rollouts:
        n = len(rollout.sequence.tokens)
        token_ids.append([[DISTILL_PAD_ID] * k for _ in range(n)])
        logprobs.append([[DISTILL_PAD_LOGPROB] * k for _ in range(n)])
        teacher_lps.append([None] * n)
    turns: list[list[dict[str, Any]]] = [[] for _ in rollouts]
    for seq_index, pair, record, rows in results:
        turns[seq_index].append(record)
        if rows is None:
            continue
        for offset, position in enumerate(range(pair.span.start, pair.span.end)):
            token_ids[seq_index][position] = rows.token_ids[offset]
            logprobs[seq_index][position] = rows.logprobs[offset]
            teacher_lps[seq_index][position] = rows.sampled_logprobs[offset]
    return {
        "distill_token_ids": token_ids,
        "distill_logprobs": logprobs,
        "overrides": [{"opd_turns": t, "teacher_logprobs": lp} for t, lp in zip(turns, teacher_lps)],
    }
