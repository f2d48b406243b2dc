"""The reference trainer's loss terms, registered by name in `LOSS_TERMS` (the names of the
`trainer.loss` weights), each a sum over the tokens it applies to (the caller divides by the
batch's trained-token count, so micro-batches add up to a token mean); `weighted_total` is the
one place the configured weights combine them. A new term is a function decorated
`@loss_term("name")` here (`needs_teacher=True` when it reads only teacher rows) and its weight in
`conf/trainer/local.yaml`.

- `pg`: GRPO/PPO-style clipped surrogate with the sequence's group-normalised
  advantage and the ratio new/old against the sampler's own logprobs (`inference_logprobs`);
- `opd_advantage`: the same surrogate with the token-level OPD advantage teacher_lp - student_lp
  (the teacher's logprob of the sampled token minus the sampler's), on positions with a teacher
  row (every trained token with teacher=model, hinted turns with teacher=self_hint),
  clamped to [-opd_clamp, opd_clamp] (one token's -9 would otherwise outweigh the batch);
- `topk_kl`: KL(student || teacher) over the teacher's top-K tokens plus one tail bin for
  the rest of the mass (both distributions stay normalised), on positions with teacher rows.
Every term reads only trained positions; pad rows are absent by construction (`Batch.has_topk`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import torch

from opd.registry import Registry
from opd.train.batch import Batch


@dataclass
class LossInputs:
    """What a loss term reads: the current policy's logprob of each token and its log-softmax at
    the previous position, the batch, the surrogate's clip and the OPD advantage's bound."""

    new_lp: torch.Tensor
    logsm: torch.Tensor
    batch: Batch
    clip: float
    opd_clamp: float | None


LossTerm = Callable[[LossInputs], torch.Tensor]
# Loss terms by the name of their weight under trainer.loss, each saying whether it needs teacher rows.
LOSS_TERMS: Registry[LossTerm] = Registry("loss term", "trainer.loss")


def loss_term(name: str, *, needs_teacher: bool = False) -> Callable[[LossTerm], LossTerm]:
    """Register a loss term under `name` (its weight is trainer.loss.<name>). `needs_teacher`: it
    reads only the teacher's rows (`overrides[i].teacher_logprobs`, `distill_*`), so it is 0, with
    no gradient, on records without them (opd.train.teacher_terms refuses a loss of only such terms
    where nothing writes them)."""
    return LOSS_TERMS.register(name, needs_teacher=needs_teacher)


def weighted_total(weights: Mapping[str, float], losses: Mapping[str, torch.Tensor | float]) -> torch.Tensor | float:
    """The loss: sum(weight x term) over the configured terms (a term of weight 0 adds nothing)."""
    return sum(weight * losses[name] for name, weight in weights.items() if weight)


@dataclass
class Terms:
    """Sums over this micro-batch (not yet divided by the trained-token count)."""

    # Each registered loss term by name.
    losses: dict[str, torch.Tensor]
    kl_to_sampler: torch.Tensor
    clipped: torch.Tensor
    opd_tokens: torch.Tensor
    topk_tokens: torch.Tensor
    # OPD advantages the clamp changed.
    opd_clamped: torch.Tensor
    # Sum of new_lp - teacher_lp over the tokens with a teacher row: the sampled-token (k1) estimate
    # of the reverse KL(current policy || teacher), the quantity on-policy distillation minimises.
    reverse_kl: torch.Tensor
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


def _opd_advantages(x: LossInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(positions with the teacher's logprob, the advantage teacher_lp - sampler_lp there
    bounded by opd_clamp, the unbounded one)."""
    where = x.batch.has_teacher & x.batch.trained
    raw = (x.batch.teacher_logprobs - x.batch.old_logprobs).detach()
    return where, (raw.clamp(-x.opd_clamp, x.opd_clamp) if x.opd_clamp is not None else raw), raw


@loss_term("pg")
def policy_gradient(x: LossInputs) -> torch.Tensor:
    advantage = x.batch.advantages.unsqueeze(-1).expand_as(x.new_lp)
    return _surrogate(x.new_lp, x.batch.old_logprobs, advantage, x.batch.trained, x.clip)[0]


@loss_term("opd_advantage", needs_teacher=True)
def opd_advantage(x: LossInputs) -> torch.Tensor:
    where, advantage, _ = _opd_advantages(x)
    return _surrogate(x.new_lp, x.batch.old_logprobs, advantage, where, x.clip)[0]


@loss_term("topk_kl", needs_teacher=True)
def topk_kl(x: LossInputs) -> torch.Tensor:
    where = x.batch.has_topk & x.batch.trained
    if x.batch.topk_ids is None or not bool(where.any()):
        return torch.zeros((), dtype=x.new_lp.dtype)
    return _topk_reverse_kl(x.logsm, x.batch, where)


def terms(logits: torch.Tensor, batch: Batch, clip: float, opd_clamp: float | None = None, names: list[str] | None = None) -> Terms:
    """The loss terms `names` (default: every registered one) of one micro-batch and what the
    trainer reports beside them; `opd_clamp` bounds the OPD advantage (None: unbounded)."""
    new_lp, logsm = token_logprobs(logits, batch.tokens)
    x = LossInputs(new_lp, logsm, batch, clip, opd_clamp)
    losses = {name: LOSS_TERMS.get(name)(x) for name in (names if names is not None else LOSS_TERMS)}
    trained = batch.trained
    # k3 estimate of KL(sampler || current) on trained tokens, which the sampler drew: with
    # r = current / sampler, E_sampler[r - 1 - log r] = KL(sampler || current). How far the policy moved.
    log_ratio = torch.where(trained, new_lp - batch.old_logprobs, torch.zeros_like(new_lp)).detach()
    kl = torch.where(trained, torch.exp(log_ratio) - 1 - log_ratio, torch.zeros_like(new_lp)).sum()
    opd_where, opd_adv, raw_adv = _opd_advantages(x)
    opd_clamped = ((opd_adv != raw_adv) & opd_where).sum().float()
    reverse_kl = torch.where(opd_where, new_lp.detach() - batch.teacher_logprobs, torch.zeros_like(new_lp)).sum()
    ratio = torch.exp(log_ratio)
    clipped = (((ratio < 1 - clip) | (ratio > 1 + clip)) & trained).sum()  # as _surrogate counts them, without a second surrogate
    empty = not bool(trained.any())
    ratio_max = torch.zeros(()) if empty else ratio[trained].max()
    ratio_min = torch.zeros(()) if empty else ratio[trained].min()
    topk_where = batch.has_topk & trained
    return Terms(losses, kl, clipped.float(), opd_where.sum().float(), topk_where.sum().float(), opd_clamped, reverse_kl,
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
