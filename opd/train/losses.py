"""The reference trainer's loss terms, each a sum over the tokens it applies to (the caller divides
by the batch's trained-token count, so micro-batches add up to a token mean).

- `policy_gradient`: GRPO/PPO-style clipped surrogate with the sequence's group-normalised
  advantage and the ratio new/old against the sampler's own logprobs (`inference_logprobs`);
- `opd_advantage`: the same surrogate with the token-level OPD advantage teacher_lp - student_lp
  (the hinted teacher's logprob of the sampled token minus the sampler's), on hinted positions,
  clamped to [-opd_clamp, opd_clamp] (one token's -9 would otherwise outweigh the batch);
- `topk_reverse_kl`: KL(student || teacher) over the teacher's top-K tokens plus one tail bin for
  the rest of the mass (both distributions stay normalised), on positions with teacher rows.
Every term reads only trained positions; pad rows are absent by construction (`Batch.has_topk`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from opd.train.batch import Batch


@dataclass
class Terms:
    """Sums over this micro-batch (not yet divided by the trained-token count)."""

    pg: torch.Tensor
    opd: torch.Tensor
    topk_kl: torch.Tensor
    kl_to_sampler: torch.Tensor
    clipped: torch.Tensor
    opd_tokens: torch.Tensor
    topk_tokens: torch.Tensor
    # OPD advantages the clamp changed.
    opd_clamped: torch.Tensor
    # The importance ratio new/sampler over trained tokens: its sum, largest and smallest value.
    ratio_sum: torch.Tensor
    ratio_max: torch.Tensor
    ratio_min: torch.Tensor


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprob of each token under the model [B, T], log-softmax at the previous position
    [B, T, V]); position 0 (nothing predicts it) gets 0 and a zero row."""
    logsm = torch.log_softmax(logits.float(), dim=-1)
    shifted = torch.zeros_like(logsm)
    shifted[:, 1:] = logsm[:, :-1]
    picked = shifted.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return picked, shifted


def _surrogate(new_lp: torch.Tensor, old_lp: torch.Tensor, advantage: torch.Tensor, where: torch.Tensor, clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum over `where` of the clipped surrogate loss, and how many ratios were clipped."""
    ratio = torch.exp(torch.where(where, new_lp - old_lp, torch.zeros_like(new_lp)))
    unclipped = ratio * advantage
    clipped = torch.clamp(ratio, 1 - clip, 1 + clip) * advantage
    loss = -torch.minimum(unclipped, clipped)
    was_clipped = ((ratio < 1 - clip) | (ratio > 1 + clip)) & where
    return torch.where(where, loss, torch.zeros_like(loss)).sum(), was_clipped.sum()


def terms(logits: torch.Tensor, batch: Batch, clip: float, opd_clamp: float | None = None) -> Terms:
    """The loss terms of one micro-batch; `opd_clamp` bounds the OPD advantage (None: unbounded)."""
    new_lp, logsm = token_logprobs(logits, batch.tokens)
    trained = batch.trained
    advantage = batch.advantages.unsqueeze(-1).expand_as(new_lp)
    pg, clipped = _surrogate(new_lp, batch.old_logprobs, advantage, trained, clip)
    # k3 estimate of KL(sampler || current) on trained tokens, which the sampler drew: with
    # r = current / sampler, E_sampler[r - 1 - log r] = KL(sampler || current). How far the policy moved.
    log_ratio = torch.where(trained, new_lp - batch.old_logprobs, torch.zeros_like(new_lp))
    kl = torch.where(trained, torch.exp(log_ratio) - 1 - log_ratio, torch.zeros_like(new_lp)).sum()
    opd_where = batch.has_teacher & trained
    raw_adv = (batch.teacher_logprobs - batch.old_logprobs).detach()
    opd_adv = raw_adv.clamp(-opd_clamp, opd_clamp) if opd_clamp is not None else raw_adv
    opd, _ = _surrogate(new_lp, batch.old_logprobs, opd_adv, opd_where, clip)
    opd_clamped = ((opd_adv != raw_adv) & opd_where).sum().float()
    ratio = torch.exp(log_ratio.detach())
    empty = not bool(trained.any())
    ratio_max = torch.zeros(()) if empty else ratio[trained].max()
    ratio_min = torch.zeros(()) if empty else ratio[trained].min()
    topk = torch.zeros((), dtype=new_lp.dtype)
    topk_where = batch.has_topk & trained
    if batch.topk_ids is not None and bool(topk_where.any()):
        topk = _topk_reverse_kl(logsm, batch, topk_where)
    return Terms(pg, opd, topk, kl, clipped.float(), opd_where.sum().float(), topk_where.sum().float(), opd_clamped,
                 torch.where(trained, ratio, torch.zeros_like(ratio)).sum(), ratio_max, ratio_min)


def _log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(x)) for x <= 0, stable near 0; the tail bin of a top-K distribution."""
    x = torch.clamp(x, max=-1e-7)
    return torch.where(x > -0.6931, torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def _topk_reverse_kl(logsm: torch.Tensor, batch: Batch, where: torch.Tensor) -> torch.Tensor:
    student = logsm.gather(-1, batch.topk_ids)  # [B, T, K]: the student's logprobs of the teacher's top-K
    teacher = batch.topk_logprobs
    s_tail = _log1mexp(torch.logsumexp(student, dim=-1, keepdim=True))
    t_tail = _log1mexp(torch.logsumexp(teacher, dim=-1, keepdim=True))
    s = torch.cat([student, s_tail], dim=-1)
    t = torch.cat([teacher, t_tail], dim=-1)
    kl = (torch.exp(s) * (s - t)).sum(dim=-1)
    return torch.where(where, kl, torch.zeros_like(kl)).sum()
