"""echo: the model is asked to say a word; a rollout passes when its answer holds the word.

Everything the framework needs of it is here and in conf/ beside this file: its config and reward
schemas, its data, its rubric, its class and the `EnvSpec` that names them
(`env.spec: third_env.echo:SPEC`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from omegaconf import MISSING

from opd.config import Config, EnvConfig
from opd.data.sources import TaskSet
from opd.envs.base import RolloutEnv, RolloutResult
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
    budget_fields = ("max_tokens",)
    build_rubric = staticmethod(rubric)

    async def rollout(self, item: dict[str, Any], temperature: float, prepared: Any) -> RolloutResult:
        prompt = self.chat_format.render_ids(self.tokenizer, [{"role": "user", "content": f"Say {item['word']}."}], None, add_generation_prompt=True)
        gen = await self.generate(prompt, max_tokens=self.cfg.max_tokens, temperature=temperature)
        sequence = Sequence.from_prompt(prompt)
        sequence.add_generated(gen.token_ids, gen.logprobs)
        text = self.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
        scored = self.rubric.score(EchoOutcome(text, item["word"]))
        return RolloutResult(sequence, scored, gen.finish_reason, prompt=item["word"], response=text)


SPEC = EnvSpec("echo", "third_env.echo:EchoEnv", load_data, env_schema=EchoEnvConfig, reward_schema=EchoRewardConfig)
