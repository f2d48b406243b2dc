"""A separate teacher model (teacher=model): its rows on every token the student sampled.

One prompt-logprob request per rollout over the rollout's exact ids (the context the student saw,
its sampled tokens and any inserted tool text) gives the teacher's top-K and its logprob of the
sampled token at every position; the rows of generated positions are kept, inserted (masked)
positions get pads. A hinted turn (opd_coding, `teacher.hint`) is scored again with the hint in
the context (`opd.distill.teacher.score_turn`) and its rows replace the plain ones there.

Requests go through the teacher's own pool (`teacher.max_concurrent` slots), apart from the
policy's, so scoring a finished rollout never holds a slot another rollout could generate in.
A teacher that cannot score a rollout (after the pool's retries) fails the group: a record
written with teacher=model has a teacher row on every trained token (`opd.records.rules`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from opd.config import ConfigError
from opd.distill.teacher import TeacherRows
from opd.records import DISTILL_PAD_ID, DISTILL_PAD_LOGPROB, MASK
from opd.serving.pool import ServerPool
from opd.serving.vllm_client import PromptScores
from opd.tracking.traces import Tracer

logger = logging.getLogger(__name__)


class TeacherModel:
    """The teacher's scoring calls over its own pool; `model` is its name (in the records)."""

    def __init__(self, pool: ServerPool, model: str, top_k: int, tracer: Tracer | None = None) -> None:
        self.pool, self.model, self.top_k = pool, model, top_k
        self.tracer = tracer or Tracer.off()

    @property
    def request_errors(self) -> int:
        return self.pool.request_errors

    async def score(self, input_ids: list[int], top_k: int, rows_from: int = 0) -> PromptScores:
        """The teacher's rows of `input_ids` from `rows_from` on (an `opd.distill.teacher.ScoreFn`)."""
        with self.tracer.span("teacher model scoring", "LLM", {"tokens": len(input_ids), "top_k": top_k}):
            return await self.pool.score(input_ids, top_k, rows_from)

    async def score_sequence(self, tokens: list[int], masks: list[int]) -> TeacherRows:
        """Rows for every position of `tokens` (pads before the first generated token and on
        masked positions), so row p is the teacher's distribution for token p."""
        first = next((p for p, m in enumerate(masks) if m != MASK), len(tokens))
        n, k = len(tokens), self.top_k
        ids = [[DISTILL_PAD_ID] * k for _ in range(n)]
        lps = [[DISTILL_PAD_LOGPROB] * k for _ in range(n)]
        sampled: list[float | None] = [None] * n
        if first >= n:
            return TeacherRows(ids, lps, sampled)
        result = await self.score(list(tokens), k, first)
        if len(result.top_ids) != n:
            raise ValueError(f"teacher rows do not cover the rollout: {len(result.top_ids)} rows for {n} tokens")
        for p in range(first, n):
            if masks[p] == MASK:
                continue
            row_ids, row_lps = result.top_ids[p], result.top_logprobs[p]
            if len(row_ids) != k or result.token_logprobs[p] is None:
                raise ValueError(f"teacher row {p} has {len(row_ids)} entries (K={k}) or no sampled-token logprob")
            ids[p], lps[p], sampled[p] = row_ids, row_lps, result.token_logprobs[p]
        return TeacherRows(ids, lps, sampled)

    async def close(self) -> None:
        await self.pool.close()


def sequence_fields(rows: list[TeacherRows]) -> dict[str, Any]:
    """The group's `distill_*` arrays and each sequence's `teacher_logprobs` from per-sequence rows."""
    return {
        "distill_token_ids": [r.token_ids for r in rows],
        "distill_logprobs": [r.logprobs for r in rows],
        "teacher_logprobs": [r.sampled_logprobs for r in rows],
    }


def teacher_metrics(group: dict[str, Any]) -> dict[str, float]:
    """teacher/* of one group: the share of trained tokens with a teacher row, and the per-token
    reverse KL to the teacher on the student's own fresh samples, KL(student || teacher) estimated
    on the sampled tokens as the mean of student_lp - teacher_lp (the k1 estimator: unbiased, since
    the student sampled them; the quantity on-policy distillation minimises, and minus the OPD
    advantage before any clamp)."""
    diffs: list[float] = []
    trained = 0
    for detail, lps, masks in zip(group["overrides"], group["inference_logprobs"], group["masks"]):
        teacher = detail.get("teacher_logprobs") or [None] * len(masks)
        for t, s, m in zip(teacher, lps, masks):
            if m == MASK:
                continue
            trained += 1
            if t is not None:
                diffs.append(s - t)
    return {
        "teacher/token_coverage": len(diffs) / trained if trained else 0.0,
        "teacher/reverse_kl": sum(diffs) / len(diffs) if diffs else 0.0,
    }


# ---- the start-up check: one tokenizer for both -----------------------------------------------


def _special(tokenizer: Any) -> dict[str, Any]:
    """Special and added tokens with their ids, and the named special tokens (eos, pad, ...)."""
    added = {str(tok): idx for tok, idx in sorted((getattr(tokenizer, "get_added_vocab", dict)() or {}).items())}
    named = {name: str(getattr(tokenizer, name, None)) for name in ("bos_token", "eos_token", "pad_token", "unk_token")}
    return {"added": added, "named": named}


def tokenizer_mismatch(student: Any, teacher: Any, compare_template: bool) -> str | None:
    """What differs between the two tokenizers (None: the same ids for every token): the
    vocabulary, the special and added tokens, and with `compare_template` the chat template."""
    s_vocab, t_vocab = student.get_vocab(), teacher.get_vocab()
    if s_vocab != t_vocab:
        only_s, only_t = len(set(s_vocab.items()) - set(t_vocab.items())), len(set(t_vocab.items()) - set(s_vocab.items()))
        return f"vocabularies differ ({len(s_vocab)} vs {len(t_vocab)} tokens; {only_s} token->id pairs only in the student's, {only_t} only in the teacher's)"
    s_special, t_special = _special(student), _special(teacher)
    if s_special != t_special:
        diff = sorted(k for k in set(s_special["named"]) | set(t_special["named"]) if s_special["named"].get(k) != t_special["named"].get(k))
        return f"special tokens differ ({', '.join(diff) or 'added tokens'})"
    if compare_template and getattr(student, "chat_template", None) != getattr(teacher, "chat_template", None):
        return "chat templates differ (the teacher renders the hinted context with its own)"
    return None


def check_tokenizers(student_dir: str, teacher_dir: str, student_name: str, teacher_name: str, compare_template: bool) -> None:
    """Fail with one line naming both models when the teacher's tokenizer is not the student's:
    the teacher's rows are read as the student's token ids."""
    from opd.serving.tokenizer import load_tokenizer

    if Path(student_dir).resolve() == Path(teacher_dir).resolve():
        return
    problem = tokenizer_mismatch(load_tokenizer(student_dir), load_tokenizer(teacher_dir), compare_template)
    if problem is not None:
        raise ConfigError(f"teacher.server.model: the teacher {teacher_name!r} does not share the student's tokenizer "
                          f"(server.model={student_name!r}): {problem}", "teacher.server.model")
    logger.info("teacher %s shares the student's tokenizer%s", teacher_name, " and chat template" if compare_template else "")
