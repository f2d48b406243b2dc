"""The reference trainer: PyTorch + transformers on the served model's checkpoint, in the run.

`LocalTrainer.step(groups)` makes one optimiser step from whole written groups (`opd.train.batch`)
with the weighted loss terms of `opd.train.losses`, in micro-batches of `micro_batch` sequences
whose gradients add up to a token mean over the batch. `save(directory)` writes a HF checkpoint
(weights, config, tokenizer) that vLLM reloads in place and `server.model=` can serve again.
It is a small trainer for experiments on data with small models on one machine; a trainer that
scales is an external one (`trainer=atropos`).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from opd.config import LocalTrainerConfig
from opd.train.batch import Batch, make_batch
from opd.train.losses import terms

logger = logging.getLogger(__name__)

def _rows(batch: Batch, rows: slice) -> Batch:
    """The micro-batch of `rows`, cut to its longest sequence."""
    length = int(batch.attention[rows].sum(dim=1).max())
    cut = (rows, slice(0, length))
    return Batch(
        batch.tokens[cut], batch.attention[cut], batch.trained[cut], batch.old_logprobs[cut], batch.advantages[rows],
        batch.teacher_logprobs[cut], batch.has_teacher[cut],
        batch.topk_ids[cut] if batch.topk_ids is not None else None, batch.topk_logprobs[cut] if batch.topk_logprobs is not None else None,
        batch.has_topk[cut],
    )


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

    def step(self, groups: list[dict[str, Any]]) -> dict[str, float]:
        """One optimiser step; returns `trainer/*` metrics (losses per term, KL to the sampler,
        clip fraction, grad norm, tokens/s)."""
        torch, cfg = self.torch, self.cfg
        started = time.monotonic()
        batch = make_batch(groups, cfg.max_tokens)
        tokens = max(1, batch.trained_tokens)
        sums = {"pg": 0.0, "opd": 0.0, "topk_kl": 0.0, "kl_to_sampler": 0.0, "clipped": 0.0, "opd_tokens": 0.0, "topk_tokens": 0.0}
        self.optimizer.zero_grad(set_to_none=True)
        for start in range(0, batch.tokens.shape[0], cfg.micro_batch):
            micro = _rows(batch, slice(start, start + cfg.micro_batch))
            logits = self.model(input_ids=micro.tokens, attention_mask=micro.attention.long()).logits
            t = terms(logits, micro, cfg.clip)
            loss = (cfg.loss.pg * t.pg + cfg.loss.opd_advantage * t.opd + cfg.loss.topk_kl * t.topk_kl) / tokens
            loss.backward()
            for name in sums:
                sums[name] += float(getattr(t, name).detach())
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm))
        self.optimizer.step()
        self.steps += 1
        seconds = time.monotonic() - started
        return {
            "trainer/loss": (cfg.loss.pg * sums["pg"] + cfg.loss.opd_advantage * sums["opd"] + cfg.loss.topk_kl * sums["topk_kl"]) / tokens,
            "trainer/loss_pg": sums["pg"] / tokens,
            "trainer/loss_opd_advantage": sums["opd"] / max(1.0, sums["opd_tokens"]),
            "trainer/loss_topk_kl": sums["topk_kl"] / max(1.0, sums["topk_tokens"]),
            "trainer/kl_to_sampler": sums["kl_to_sampler"] / tokens,
            "trainer/clip_fraction": sums["clipped"] / tokens,
            "trainer/grad_norm": grad_norm,
            "trainer/trained_tokens": float(tokens),
            "trainer/opd_tokens": sums["opd_tokens"],
            "trainer/tokens_per_s": tokens / max(seconds, 1e-9),
            "trainer/step_s": seconds,
            "trainer/steps": float(self.steps),
        }

    def save(self, directory: Path) -> Path:
        """A HF checkpoint of the current weights (with the tokenizer files), for vLLM and HF."""
        from transformers import AutoTokenizer

        directory.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(directory, safe_serialization=True)
        if self._tokenizer is None:
            self._tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self._tokenizer.save_pretrained(directory)
        return directory
