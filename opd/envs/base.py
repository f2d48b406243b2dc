"""The shared base of our environments: atroposlib's `BaseEnv` wired to stock vLLM, no wandb.

Subclasses implement `get_next_item`, `collect_trajectories` (returning a checked
`ScoredDataGroup`), `evaluate` and `group_metrics`. The generation loop lives in `opd.runner`,
not in atroposlib's `process_manager` (which has no error isolation and can loop forever).
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass
from typing import Any

import tenacity
from atroposlib.envs.base import BaseEnv, BaseEnvConfig
from atroposlib.envs.server_handling.server_baseline import APIServerConfig

from opd.records import MASK, MASKED_LOGPROB
from opd import tracing
from opd.serving.slots import SlotServerManager
from opd.serving.vllm_client import OpenAIVLLMServer

logger = logging.getLogger(__name__)


@dataclass
class Generation:
    """One sampled continuation: the ids vLLM sampled, their logprobs and why it stopped."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str


@dataclass
class Sequence:
    """A growing record of one rollout: prompt, generated and inserted tokens, aligned."""

    tokens: list[int]
    masks: list[int]
    logprobs: list[float]

    @classmethod
    def from_prompt(cls, prompt_ids: list[int]) -> "Sequence":
        return cls(list(prompt_ids), [MASK] * len(prompt_ids), [MASKED_LOGPROB] * len(prompt_ids))

    def add_generated(self, generation: Generation) -> None:
        """Sampled tokens: trained (mask = id) with the sampler's logprobs."""
        self.tokens += generation.token_ids
        self.masks += generation.token_ids
        self.logprobs += generation.logprobs

    def add_inserted(self, token_ids: list[int]) -> None:
        """Tokens the environment inserted (tool responses): masked, placeholder logprobs."""
        self.tokens += token_ids
        self.masks += [MASK] * len(token_ids)
        self.logprobs += [MASKED_LOGPROB] * len(token_ids)


def unwrap_retry(err: BaseException) -> BaseException:
    """atroposlib wraps failures of its retried calls in tenacity.RetryError (sometimes twice):
    return the cause."""
    while isinstance(err, tenacity.RetryError) and err.last_attempt.exception() is not None:
        err = err.last_attempt.exception()  # type: ignore[assignment]
    return err


class OPDBaseEnv(BaseEnv):
    """`BaseEnv` with our vLLM server class, wandb off, and helpers for token-exact generation."""

    server_cls = OpenAIVLLMServer

    def __init__(self, tokenizer_path: str, server_configs: list[APIServerConfig], group_size: int, max_token_length: int) -> None:
        base_config = BaseEnvConfig(
            tokenizer_name=tokenizer_path,
            group_size=group_size,
            use_wandb=False,
            max_token_length=max_token_length,
            ensure_scores_are_not_same=False,
            data_path_to_save_groups=None,  # we write groups ourselves (flushed per group)
            include_messages=False,
        )
        super().__init__(base_config, server_configs, slurm=False, testing=False)
        # atroposlib's manager polls every second for a free slot; ours waits for a release.
        self.server = SlotServerManager(server_configs, server_class=self.server_cls, reasoning_config=self.server.reasoning_config)

    async def setup(self) -> None:
        """Data is loaded before the env is built (opd.build); nothing to do here."""

    async def generate(self, prompt_ids: list[int], *, max_tokens: int, temperature: float, top_p: float = 1.0, stop: list[str] | None = None, split: str = "train") -> Generation:
        """Sample one continuation of `prompt_ids`; raises the cause of a failure (for the server:
        ServerRequestError naming the URL and status), not atroposlib's RetryError around it."""
        kwargs: dict[str, Any] = {
            "input_ids": prompt_ids,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "n": 1,
            "skip_special_tokens": False,
            "split": split,
        }
        if stop:
            kwargs["stop"] = stop
        with tracing.span("generate", "LLM", {"prompt_tokens": len(prompt_ids), "max_tokens": max_tokens, "temperature": temperature, "stop": stop}) as span:
            try:
                _, ids, logprobs, reasons = await self.server.tokens_and_logprobs_completion(**kwargs)
            except Exception as err:
                raise unwrap_retry(err) from None
            if span.active:
                span.outputs({"text": self.tokenizer.decode(ids[0]), "tokens": len(ids[0]), "finish_reason": reasons[0]})
        return Generation(ids[0], logprobs[0], reasons[0])

    def group_metrics(self, group: dict[str, Any]) -> dict[str, float]:
        """Per-group metrics logged after the group is written (keys are MLflow metric names).

        This base part reads what every env records: scores, `reward_signals`, `tool_errors`,
        `generated_tokens`; subclasses add their own.
        """
        details = group["overrides"]
        n = len(details)
        metrics = {
            "reward/mean": statistics.fmean(group["scores"]),
            "reward/std": statistics.pstdev(group["scores"]),
            "tool_errors/mean": sum(d["tool_errors"] for d in details) / n,
            "tokens/generated_mean": sum(d["generated_tokens"] for d in details) / n,
            "tokens/sequence_mean": sum(len(t) for t in group["tokens"]) / n,
        }
        for name in details[0]["reward_signals"]:
            metrics[f"reward/{name}"] = sum(d["reward_signals"][name] for d in details) / n
        return metrics

    async def close(self) -> None:
        for server in self.server.servers:
            if isinstance(server, OpenAIVLLMServer):
                await server.close()
