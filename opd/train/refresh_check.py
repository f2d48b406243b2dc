"""Does the server serve the weights the trainer has? A fixed probe after every refresh.

The probe is a fixed text of `trainer.refresh_check.tokens` tokens. After each refresh every server
scores it (prompt logprobs) and the trainer's model computes the same logprobs on the same ids,
with its weights rounded to the servers' dtype (`trainer.refresh_check.dtype`; trained float32
weights are not bf16 numbers, and their rounding alone moves the fixture's logprobs by 0.010);
the check is their mean absolute difference in nats, the largest over the servers. Every logprob
goes through the output layer, so a server that kept an old output layer (a tied model after an
in-place reload, `opd.train.untied`) or old weights anywhere shows at once.

What is left is the servers' arithmetic (bf16 activations against float32: 0.015 nats on the
fixture's probe), the noise floor, measured when the loop starts, where both hold the same checkpoint. That start may not exceed
`max_start` (else the server holds another model), and every later check may not exceed
`tolerance` times it (plus `SLACK` nats, for servers whose floor is near 0, e.g. float32): a run
beyond that fails with a message that says what was measured and the likely cause.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from opd.config import RefreshCheckConfig
from opd.serving.vllm_client import VLLMClient

# (probe ids, the servers' dtype) -> the trainer's logprob of each id.
TrainerLogprobs = Callable[[list[int], str], list[float]]

logger = logging.getLogger(__name__)

# Nats added to the tolerance: float32 servers have a floor near 0, where a ratio alone is too tight.
SLACK = 0.002

# Text of the kinds the environments make (chat turns, a tool call, numbers, code), repeated to length.
PROBE_TEXT = (
    "<|im_start|>system\nYou are a careful assistant. Think step by step, use a tool when it helps, and give the final "
    "answer in \\boxed{}.<|im_end|>\n<|im_start|>user\nHow many digits does 40962 have? Is 7315 even or odd?<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nI count the digits: 4, 0, 9, 6, 2. That is five digits. Let me check with the tool.\n"
    "<tool_call>\n{\"name\": \"python_interpreter\", \"arguments\": {\"code\": \"print(len(str(40962)), 7315 % 2)\"}}\n"
    "</tool_call>\n<tool_response>\n5 1\n</tool_response>\nThe remainder is 1, so 7315 is odd.\n</think>\n"
    "The number has \\boxed{5} digits.<|im_end|>\n<|im_start|>user\nWrite solution.py with a function add(a, b).<|im_end|>\n"
    "<|im_start|>assistant\ndef add(a, b):\n    return a + b\n\nif __name__ == \"__main__\":\n    assert add(2, 3) == 5\n"
)


class RefreshMismatch(RuntimeError):
    """The server's logprobs on the probe are not the trainer's: it does not serve the trained weights."""


def probe_ids(tokenizer: Any, tokens: int) -> list[int]:
    """The probe's first `tokens` ids under `tokenizer` (the text repeated as often as needed)."""
    ids: list[int] = []
    while len(ids) < tokens:
        ids += tokenizer.encode(PROBE_TEXT, add_special_tokens=False)
    return ids[:tokens]


def mean_abs(served: list[float | None], trained: list[float]) -> float:
    """Mean |served - trained| over the positions the server scored (position 0 has no logprob)."""
    pairs = [(s, t) for s, t in zip(served, trained) if s is not None]
    if not pairs:
        raise RefreshMismatch("the server returned no prompt logprobs for the refresh probe")
    return sum(abs(s - t) for s, t in pairs) / len(pairs)


class RefreshCheck:
    """The probe over `base_urls` (served as `model`); `trainer_logprobs(ids, dtype)` gives the
    trainer's side, its weights rounded to `dtype`."""

    def __init__(self, cfg: RefreshCheckConfig, base_urls: list[str], model: str, tokenizer: Any, api_key: str = "opd-local", timeout_s: float = 120.0) -> None:
        self.cfg = cfg
        self.clients = [VLLMClient(url, model, api_key, timeout_s) for url in base_urls]
        self.ids = probe_ids(tokenizer, cfg.tokens)
        # Mean abs difference when server and trainer hold the same checkpoint (set by `start`).
        self.floor: float | None = None

    @property
    def limit(self) -> float:
        """The largest difference a later check accepts."""
        assert self.floor is not None, "RefreshCheck.start() measures the floor first"
        return self.cfg.tolerance * self.floor + SLACK

    async def measure(self, trainer_logprobs: TrainerLogprobs) -> dict[str, float]:
        """Mean abs difference of each server's logprobs on the probe from the trainer's, by URL."""
        import asyncio

        mine = await asyncio.to_thread(trainer_logprobs, self.ids, self.cfg.dtype)
        out = {}
        for client in self.clients:
            try:
                served = (await client.score(self.ids, 1)).token_logprobs
            finally:
                await client.close()
            out[client.base_url] = mean_abs(served, mine)
        return out

    async def start(self, trainer_logprobs: TrainerLogprobs) -> float:
        """Measure the noise floor on the starting checkpoint; fail when it is not that checkpoint."""
        measured = await self.measure(trainer_logprobs)
        url, worst = max(measured.items(), key=lambda kv: kv[1])
        if worst > self.cfg.max_start:
            raise RefreshMismatch(
                f"the server at {url} does not serve the checkpoint the trainer starts from: its logprobs on a fixed probe of "
                f"{len(self.ids)} tokens differ from the trainer's by {worst:.4f} nats (mean absolute), above "
                f"trainer.refresh_check.max_start={self.cfg.max_start:g}. Serve the same checkpoint (server.model), in a dtype "
                f"near the trainer's float32 (server.dtype)."
            )
        self.floor = worst
        logger.info("refresh check: served and trained logprobs of the start differ by %.4f nats (the noise floor; a later refresh "
                    "may differ by up to %.4f)", worst, self.limit)
        return worst

    async def after_refresh(self, trainer_logprobs: TrainerLogprobs, version: int) -> float:
        """Check the served weights after the refresh to `version`; the largest difference. Raises
        `RefreshMismatch` beyond `limit`."""
        measured = await self.measure(trainer_logprobs)
        url, worst = max(measured.items(), key=lambda kv: kv[1])
        if worst > self.limit:
            raise RefreshMismatch(
                f"after the refresh to weight version {version}, the server at {url} does not serve the trainer's weights: its "
                f"logprobs on a fixed probe of {len(self.ids)} tokens differ from the trainer's by {worst:.4f} nats (mean absolute), "
                f"beyond {self.limit:.4f} (trainer.refresh_check.tolerance={self.cfg.tolerance:g} x the start's noise floor "
                f"{self.floor:.4f} + {SLACK:g}). A reload from a checkpoint without its own output layer (a model with tied "
                f"embeddings saved as such) keeps the server's old one: the trainer saves untied checkpoints (opd.train.untied); "
                f"a server of your own should load an untied copy (python -m opd.train.untied <model> <dir>, then serve <dir>)."
            )
        return worst
