"""echo: the model is asked to say a word; a rollout passes when its answer holds the word.

Everything the framework needs of it is here and in conf/ beside this file: its config and reward
schemas, its data, its rubric, its class and the `EnvSpec` that names them
(`env.spec: third_env.echo:SPEC`).
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any

from omegaconf import MISSING

from opd.config import Config, EnvConfig
from opd.data.sources import TaskSet
from opd.envs.base import ItemResult, RolloutEnv
from opd.envs.registry import EnvSpec
from opd.records import Sequence
from opd.rewards.rubric import PassRule, Rubric, Signals

WORDS = ["apple", "river", "stone", "cloud", "maple", "ember", "delta", "orbit", "prism", "quill", "sable", "tundra"]


@dataclass
class EchoEnvConfig(EnvConfig):
    max_tokens: int = MISSING


@dataclass
class EchoWeights:
    said: float = MISSING


@dataclass
class EchoRewardConfig:
    weights: EchoWeights = MISSING


@dataclass(frozen=True)
class EchoOutcome:
    text: str
    word: str


SIGNALS: Signals[EchoOutcome] = Signals()


@SIGNALS.add
def said(outcome: EchoOutcome, params: object = None) -> float:
    return float(outcome.word in outcome.text.lower())


def rubric(cfg: EchoRewardConfig) -> Rubric[EchoOutcome]:
    return Rubric(SIGNALS, cfg.weights, passing=PassRule("said", 1.0))


def load_data(cfg: Config) -> TaskSet:
    rng = random.Random(cfg.dataset.split_seed)
    items = [{"id": f"echo-{i}", "word": rng.choice(WORDS)} for i in range(24)]
    return TaskSet(items[4:], items[:4], "echo:24")


class EchoEnv(RolloutEnv):
    name = "echo"
    build_rubric = staticmethod(rubric)

    def __init__(self, cfg: EchoEnvConfig, reward: EchoRewardConfig, **common: Any) -> None:
        super().__init__(temperature=cfg.temperature, sampling=cfg.sampling, eval_temperature=cfg.eval_temperature, tools=[], **common)
        self.cfg = cfg
        self.rubric = self.build_rubric(reward)

    async def rollout(self, item: dict[str, Any], temperature: float) -> tuple[Sequence, Any, str, str]:
        prompt = self.chat_format.render_ids(self.tokenizer, [{"role": "user", "content": f"Say {item['word']}."}], None, add_generation_prompt=True)
        gen = await self.generate(prompt, max_tokens=self.cfg.max_tokens, temperature=temperature)
        sequence = Sequence.from_prompt(prompt)
        sequence.add_generated(gen.token_ids, gen.logprobs)
        text = self.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
        return sequence, self.rubric.score(EchoOutcome(text, item["word"])), text, gen.finish_reason

    async def make_group(self, item: dict[str, Any], roots: list[Any]) -> Any:
        results = await asyncio.gather(*(self.rollout(item, self.temperature) for _ in roots))
        details = [{"reward_signals": s.signals, "passed": self.rubric.passed(s.signals), "tool_calls": 0, "tool_errors": 0, "finish": finish,
                    "generated_tokens": sum(m != -100 for m in seq.masks)} for seq, s, _, finish in results]
        return self.group_record(item, [r[0] for r in results], [r[1].total for r in results], details, {"max_tokens": self.cfg.max_tokens})

    def env_metrics(self, group: dict[str, Any]) -> dict[str, float]:
        details = group["overrides"]
        return {"accuracy": sum(d["passed"] for d in details) / len(details)}

    async def eval_item(self, item: dict[str, Any], temperature: float) -> ItemResult:
        _, scored, text, _ = await self.rollout(item, temperature)
        return ItemResult(self.rubric.passed(scored.signals), scored.total, prompt=item["word"], response=text)


SPEC = EnvSpec("echo", "third_env.echo:EchoEnv", load_data, env_schema=EchoEnvConfig, reward_schema=EchoRewardConfig)
