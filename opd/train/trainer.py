"""The reference trainer: PyTorch + transformers on the served model's checkpoint, in the run.

`LocalTrainer.step(groups)` makes one optimiser step from whole written groups (`opd.train.batch`)
with the weighted loss terms of `opd.train.losses`, in micro-batches of `micro_batch` sequences of
one group whose gradients add up to a token mean over the batch; with `shared_prefix` the prompt a
micro-batch's rollouts share runs once (`opd.train.prefix`). With `equal_score_groups: drop`, a group
whose rollouts all scored the same is left out (it has no policy-gradient signal and would only
dilute the token mean), unless it carries the hinted teacher's logprobs (opd_coding's OPD terms).
`save(directory)` writes a HF checkpoint (weights, config, tokenizer) whose output layer is a tensor
of its own (`opd.train.untied`), which vLLM reloads in place whole and `server.model=` can serve
again. `probe_logprobs(ids)` is the model's logprob of each token, for the refresh check.
It is a small trainer for experiments on data with small models on one machine; a trainer that
scales is an external one (`trainer=atropos`).
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

from opd.config import LocalTrainerConfig
from opd.train.batch import Batch, equal_scores, has_teacher_signal, make_batch
from opd.train.losses import terms, token_logprobs, weighted_total
from opd.train.prefix import logits_after_prefix, shared_prefix_length
from opd.train.teacher_terms import teacher_terms
from opd.train.untied import save_untied

logger = logging.getLogger(__name__)

def _rows(batch: Batch, rows: slice, start: int = 0) -> Batch:
    """The micro-batch of `rows`, cut to its longest sequence, from column `start` on."""
    length = int(batch.attention[rows].sum(dim=1).max())
    cut = (rows, slice(start, length))
    return Batch(
        batch.tokens[cut], batch.attention[cut], batch.trained[cut], batch.old_logprobs[cut], batch.advantages[rows],
        batch.teacher_logprobs[cut], batch.has_teacher[cut],
        batch.topk_ids[cut] if batch.topk_ids is not None else None, batch.topk_logprobs[cut] if batch.topk_logprobs is not None else None,
        batch.has_topk[cut],
    )


def micro_batches(groups: list[dict[str, Any]], size: int) -> list[slice]:
    """Row slices of at most `size` sequences, each within one group (whose rows share a prompt)."""
    out, start = [], 0
    for group in groups:
        end = start + len(group["tokens"])
        out += [slice(row, min(row + size, end)) for row in range(start, end, size)]
        start = end
    return out


class LocalTrainer:
    def __init__(self, cfg: LocalTrainerConfig, model_dir: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        torch.manual_seed(cfg.seed)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.torch = torch
        self.cfg = cfg
        self.model_dir = model_dir
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay, betas=(0.9, 0.99))
        self.steps = 0
        self._tokenizer: Any = None

    def trainable(self, groups: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
        """The groups this step trains on, and how many equal-score groups were left out. An
        equal-score group with teacher rows stays when a weighted term reads them; where none does
        (arm=grpo beside a teacher), it would only dilute the policy gradient's token mean."""
        if self.cfg.equal_score_groups == "keep":
            return groups, 0
        needs_teacher = teacher_terms()
        taught = any(weight and name in needs_teacher for name, weight in self.cfg.loss.items())
        kept = [g for g in groups if not equal_scores(g) or (taught and has_teacher_signal(g))]
        return kept, len(groups) - len(kept)

    def step(self, groups: list[dict[str, Any]]) -> dict[str, float] | None:
        """One optimiser step; returns `trainer/*` metrics (every loss term as a sum over the batch
        divided by its trained tokens, as `trainer/loss` is, so that the loss is the weighted sum of
        the terms; KL to the sampler, the importance ratio, clip fraction, grad norm, tokens/s).
        None when no group is left to train on (every one had equal scores and was dropped)."""
        torch, cfg = self.torch, self.cfg
        started = time.monotonic()
        groups, dropped = self.trainable(groups)
        if not groups:
            return None
        batch = make_batch(groups, cfg.max_tokens)
        tokens = max(1, batch.trained_tokens)
        weights = dict(cfg.loss)
        losses = {name: 0.0 for name in weights}
        sums = {"kl_to_sampler": 0.0, "clipped": 0.0, "opd_tokens": 0.0, "topk_tokens": 0.0, "opd_clamped": 0.0, "reverse_kl": 0.0, "ratio_sum": 0.0}
        ratio_max, ratio_min = 0.0, math.inf
        self.optimizer.zero_grad(set_to_none=True)
        for rows in micro_batches(groups, cfg.micro_batch):
            micro, logits = self.forward(batch, rows)
            t = terms(logits, micro, cfg.clip, cfg.opd_clamp, names=list(weights))
            (weighted_total(weights, t.losses) / tokens).backward()
            for name, value in t.losses.items():
                losses[name] += float(value.detach())
            for name in sums:
                sums[name] += float(getattr(t, name).detach())
            if bool(micro.trained.any()):
                ratio_max, ratio_min = max(ratio_max, float(t.ratio_max)), min(ratio_min, float(t.ratio_min))
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm))
        self.optimizer.step()
        self.steps += 1
        seconds = time.monotonic() - started
        per_token = {name: value / tokens for name, value in losses.items()}
        return {
            "trainer/loss": float(weighted_total(weights, per_token)),
            **{f"trainer/loss_{name}": value for name, value in per_token.items()},
            "trainer/kl_to_sampler": sums["kl_to_sampler"] / tokens,
            # new/sampler before this step's update: how far the trained weights are from those that sampled.
            "trainer/ratio_mean": sums["ratio_sum"] / tokens,
            "trainer/ratio_max": ratio_max,
            "trainer/ratio_min": ratio_min if math.isfinite(ratio_min) else 0.0,
            "trainer/clip_fraction": sums["clipped"] / tokens,
            "trainer/grad_norm": grad_norm,
            "trainer/trained_tokens": float(tokens),
            "trainer/opd_tokens": sums["opd_tokens"],
            "trainer/topk_tokens": sums["topk_tokens"],
            "trainer/opd_clamped_fraction": sums["opd_clamped"] / max(1.0, sums["opd_tokens"]),
            # Per token with a teacher row, at the weights before this step: the batch's reverse KL to the teacher.
            **({"trainer/reverse_kl_to_teacher": sums["reverse_kl"] / sums["opd_tokens"]} if sums["opd_tokens"] else {}),
            "trainer/equal_score_groups_dropped": float(dropped),
            "trainer/tokens_per_s": tokens / max(seconds, 1e-9),
            "trainer/step_s": seconds,
            "trainer/steps": float(self.steps),
        }

    def forward(self, batch: Batch, rows: slice) -> tuple[Batch, Any]:
        """The micro-batch of `rows` and the current model's logits at each of its positions. With
        `shared_prefix`, the prompt the rows share runs once and the micro-batch starts at its last
        position (the earlier ones are never trained, nor read by a loss term)."""
        micro = _rows(batch, rows)
        prefix = shared_prefix_length(list(zip(micro.tokens.tolist(), micro.trained.tolist()))) if self.cfg.shared_prefix else 0
        if prefix < 2:
            return micro, self.model(input_ids=micro.tokens, attention_mask=micro.attention.long()).logits
        return _rows(batch, rows, prefix - 1), logits_after_prefix(self.model, micro.tokens, micro.attention, prefix)

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        return self._tokenizer

    def probe_logprobs(self, ids: list[int], served_dtype: str | None = None) -> list[float]:
        """The current weights' logprob of each of `ids` given those before it (position 0: 0.0), as
        vLLM's prompt logprobs report them; computed in float32 with the weights rounded to
        `served_dtype` (vLLM's --dtype name) where a server holds them in less (a transient copy:
        the trained weights are never touched), so that only the arithmetic differs from a server's."""
        from torch.func import functional_call

        torch = self.torch
        rounding = {"bfloat16": torch.bfloat16, "float16": torch.float16, "half": torch.float16}.get(served_dtype or "")
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                tensor = torch.tensor([ids])
                if rounding is None:
                    logits = self.model(input_ids=tensor).logits
                else:
                    # Every name of a tied tensor gets the same rounded copy (state_dict lists each name).
                    rounded = {name: t.to(rounding).to(t.dtype) for name, t in self.model.state_dict().items()}
                    logits = functional_call(self.model, rounded, (), {"input_ids": tensor}, tie_weights=False).logits
                return token_logprobs(logits, tensor)[0][0].tolist()
        finally:
            self.model.train(was_training)

    def save(self, directory: Path) -> Path:
        """A HF checkpoint of the current weights with the tokenizer files, for vLLM and HF; the
        output layer is a tensor of its own (`opd.train.untied`), so an in-place reload takes all of it."""
        save_untied(self.model, directory)
        self.tokenizer.save_pretrained(directory)
        return directory
