"""The environments' schemas (conf/env/): what every environment has, and the project's two."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from omegaconf import MISSING

from opd.config.checks import Check, at_least, checked, fraction, one_of, within
from opd.config.sandbox import SandboxConfig


@dataclass
class EnvConfig:
    """Fields every environment has (conf/env/common/sampling.yaml)."""

    name: str = MISSING
    spec: Optional[str] = MISSING
    temperature: float = checked(within(0, 5))
    top_p: Optional[float] = checked(within(0, 1, "(]"), null="not sent")
    top_k: Optional[int] = checked(Check("-1 (off) or >= 1", lambda v: v == -1 or v >= 1), null="not sent")
    min_p: Optional[float] = checked(fraction(), null="not sent")
    eval_temperature: float = checked(within(0, 5))

    @property
    def sampling(self) -> dict[str, Any]:
        """top_p, top_k and min_p as request fields; a null one is not sent (the model's
        generation_config.json decides it)."""
        return {k: v for k, v in (("top_p", self.top_p), ("top_k", self.top_k), ("min_p", self.min_p)) if v is not None}


@dataclass
class InlineMathEnvConfig(EnvConfig):
    """env=inline_math (conf/env/inline_math.yaml)."""

    max_tool_calls: int = checked(at_least(0))
    max_new_tokens: int = checked(at_least(1))
    max_tokens_per_segment: int = checked(at_least(1))
    few_shots: int = checked(within(0, 2))
    dynamic_pool_size: int = checked(at_least(0))
    dynamic_shots: int = checked(at_least(0))
    problem_suffix: str = MISSING
    tool_instruction: bool = MISSING
    calculator_max_chars: int = checked(at_least(1))
    drop_equal_scores: Optional[bool] = MISSING
    sandbox: SandboxConfig = MISSING


@dataclass
class OPDConfig:
    """env.opd of opd_coding (conf/env/opd_coding.yaml)."""

    enabled: bool = MISSING
    topk: int = checked(at_least(1))
    hint_placement: str = checked(one_of("last_user", "system", "new_user"))
    hint_header: str = MISSING
    max_state_chars: int = checked(at_least(1))
    max_response_chars: Optional[int] = checked(at_least(1), null="the whole turn")
    response_cut: str = checked(one_of("tail", "head"))
    max_concurrency: int = checked(at_least(1))


@dataclass
class OPDCodingEnvConfig(EnvConfig):
    """env=opd_coding (conf/env/opd_coding.yaml)."""

    max_turns: int = checked(at_least(1))
    max_tokens_per_turn: int = checked(at_least(1))
    system_prompt: Optional[str] = MISSING
    show_tests: bool = MISSING
    max_file_chars: int = checked(at_least(1))
    sandbox: SandboxConfig = MISSING
    opd: OPDConfig = MISSING
