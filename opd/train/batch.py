"""Records -> training tensors: what a trainer needs from written groups, and nothing else.

Per sequence (padded to the batch's longest, right-padded):
- `tokens` [B, T] and `trained` [B, T] (True where `masks` is the token id: sampled by the policy);
- `old_logprobs` [B, T]: the sampler's `inference_logprobs` (0 where not trained);
- `advantages` [B]: the group-normalised score, (score - group mean) / (group std + eps), 0 for a
  group whose scores are all equal (it says nothing about which rollout was better);
- `teacher_logprobs` [B, T] and `has_teacher` [B, T]: the teacher's logprob of the sampled token
  (`overrides[i].teacher_logprobs`, null elsewhere: every trained token with teacher=model, the
  hinted, scored turns with teacher=self_hint);
- `topk_ids` / `topk_logprobs` [B, T, K] and `has_topk` [B, T]: the teacher's top-K rows; pad rows
  (id -1) are marked absent and their ids replaced by 0, so a pad is never read as a token.
Position p's token is predicted from positions < p: the loss reads logits at p - 1 for token p.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from opd.records import DISTILL_PAD_ID, MASK


@dataclass
class Batch:
    tokens: torch.Tensor
    attention: torch.Tensor
    trained: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    teacher_logprobs: torch.Tensor
    has_teacher: torch.Tensor
    topk_ids: torch.Tensor | None
    topk_logprobs: torch.Tensor | None
    has_topk: torch.Tensor

    @property
    def trained_tokens(self) -> int:
        return int(self.trained.sum())


def group_advantages(scores: list[float], eps: float = 1e-6) -> list[float]:
    """(score - mean) / (std + eps) within one group (std over the group, not the sample); zeros
    when std < eps (every score the same, or as good as). Finite for any finite scores, up to
    float64's largest: the deviations from the mean are exact (integers: every float is one times
    a power of two), and the std is taken of the deviations divided by the largest of them, in
    [-1, 1], so no step overflows, underflows to a false zero, or loses the difference of two
    scores an ulp apart. ValueError for a score that is not a finite number."""
    values = [float(s) for s in scores]
    if (bad := next((i for i, v in enumerate(values) if not math.isfinite(v)), None)) is not None:
        raise ValueError(f"scores[{bad}] is not a finite number: {values[bad]!r}")
    if not values:
        return []
    n = len(values)
    ratios = [v.as_integer_ratio() for v in values]  # denominators are powers of two
    shift = max(den.bit_length() for _, den in ratios) - 1
    scaled = [num << (shift - den.bit_length() + 1) for num, den in ratios]  # score * 2**shift, exact
    total = sum(scaled)
    deviations = [n * x - total for x in scaled]  # (score - mean) * n * 2**shift, exact
    largest = max(map(abs, deviations))
    if largest == 0:
        return [0.0] * n
    normed = [d / largest for d in deviations]  # int / int: correctly rounded, in [-1, 1]
    spread = math.sqrt(math.fsum(u * u for u in normed) / n)  # std / largest deviation, in [1/sqrt(n), 1]
    # std = largest * spread / (n * 2**shift); compared with eps, and eps on the same scale, in integers.
    eps_num, eps_den = float(eps).as_integer_ratio()
    spread_num, spread_den = spread.as_integer_ratio()
    if largest * spread_num * eps_den < eps_num * spread_den * (n << shift):
        return [0.0] * n
    scaled_eps = (eps_num * (n << shift)) / (eps_den * largest)  # <= 1 here (largest deviation >= std >= eps)
    return [u / (spread + scaled_eps) for u in normed]


def equal_scores(group: dict[str, Any]) -> bool:
    """Whether every rollout of `group` scored the same (its group-normalised advantages are 0)."""
    scores = [float(s) for s in group["scores"]]
    return len(set(scores)) <= 1


def has_teacher_signal(group: dict[str, Any]) -> bool:
    """Whether `group` carries a teacher's logprobs on some token (teacher=self_hint or model)."""
    details = group.get("overrides") or []
    return any(isinstance(d, dict) and any(t is not None for t in d.get("teacher_logprobs") or []) for d in details)


def make_batch(groups: list[dict[str, Any]], max_tokens: int | None = None) -> Batch:
    """One batch from whole groups (each group's advantages computed within it); sequences are cut
    to `max_tokens` (their trained positions past it are dropped)."""
    rows: list[dict[str, Any]] = []
    for group in groups:
        for i, advantage in enumerate(group_advantages([float(s) for s in group["scores"]])):
            rows.append({"group": group, "i": i, "advantage": advantage})
    length = max(len(r["group"]["tokens"][r["i"]]) for r in rows)
    length = min(length, max_tokens) if max_tokens else length
    k = next((len(g["distill_token_ids"][0][0]) for g in groups if g.get("distill_token_ids")), 0)
    b = len(rows)
    tokens = torch.zeros(b, length, dtype=torch.long)
    attention = torch.zeros(b, length, dtype=torch.bool)
    trained = torch.zeros(b, length, dtype=torch.bool)
    old = torch.zeros(b, length)
    teacher = torch.zeros(b, length)
    has_teacher = torch.zeros(b, length, dtype=torch.bool)
    topk_ids = torch.zeros(b, length, k, dtype=torch.long) if k else None
    topk_lps = torch.zeros(b, length, k) if k else None
    has_topk = torch.zeros(b, length, dtype=torch.bool)
    for row, r in enumerate(rows):
        group, i = r["group"], r["i"]
        seq = group["tokens"][i][:length]
        n = len(seq)
        tokens[row, :n] = torch.tensor(seq)
        attention[row, :n] = True
        masks = torch.tensor(group["masks"][i][:n])
        trained[row, :n] = masks != MASK
        trained[row, 0] = False  # nothing predicts the first token
        lps = torch.tensor(group["inference_logprobs"][i][:n], dtype=torch.float32)
        old[row, :n] = torch.where(trained[row, :n], lps, torch.zeros_like(lps))
        detail = group["overrides"][i] if group.get("overrides") else {}
        teacher_row = detail.get("teacher_logprobs") if isinstance(detail, dict) else None
        if teacher_row:
            present = torch.tensor([t is not None for t in teacher_row[:n]])
            values = torch.tensor([t if t is not None else 0.0 for t in teacher_row[:n]], dtype=torch.float32)
            has_teacher[row, :n] = present & trained[row, :n]
            teacher[row, :n] = values
        if k and group.get("distill_token_ids"):
            ids = torch.tensor(group["distill_token_ids"][i][:n], dtype=torch.long)
            lp = torch.tensor(group["distill_logprobs"][i][:n], dtype=torch.float32)
            real = (ids != DISTILL_PAD_ID).all(dim=-1) & trained[row, :n]
            has_topk[row, :n] = real
            topk_ids[row, :n] = torch.where(real.unsqueeze(-1), ids, torch.zeros_like(ids))
            topk_lps[row, :n] = torch.where(real.unsqueeze(-1), lp, torch.zeros_like(lp))
    advantages = torch.tensor([r["advantage"] for r in rows], dtype=torch.float32)
    return Batch(tokens, attention, trained, old, advantages, teacher, has_teacher, topk_ids, topk_lps, has_topk)
