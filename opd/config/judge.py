"""The judge's schemas (conf/judge/): on the policy's server, or on a server of its own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from omegaconf import MISSING

from opd.config.checks import at_least, checked, join, nonempty, one_of, relation, require, url, within


@dataclass
class JudgeConfig:
    """judge=policy: the judge runs on the policy's server (conf/judge/policy.yaml)."""

    kind: str = checked(one_of("policy", "server"))
    votes: int = checked(at_least(1))
    votes_in_one_request: bool = MISSING
    retry_votes_alone: bool = MISSING
    max_tokens: int = checked(at_least(1))
    temperature: float = checked(within(0, 5))
    decision_rule: str = checked(one_of("majority", "any", "unanimous"))
    hint_choice: str = checked(one_of("longest", "first"))
    min_hint_chars: int = checked(at_least(0))


@dataclass
class JudgeServerConfig(JudgeConfig):
    """judge=server: the judge on its own OpenAI-compatible server (conf/judge/server.yaml)."""

    base_url: str = checked(url())
    model: str = checked(nonempty("set when judge.kind=server"))
    api_key: str = MISSING
    keepalive_s: float = checked(at_least(0.1))
    tokenizer: Optional[str] = checked(nonempty("a model directory or hub name"), null="judge.model when it is a local directory or a cached hub model")


@relation(JudgeServerConfig)
def server_kind_with_server_fields(judge: JudgeServerConfig, at: str) -> None:
    require(judge.kind == "server", join(at, "kind"), "server with judge=server's fields", judge.kind)
