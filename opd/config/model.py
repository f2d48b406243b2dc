"""The model preset's schema (conf/model/): a model family's formats and per-environment budgets."""

from __future__ import annotations

from dataclasses import dataclass
from string import Template
from typing import Any, Optional

from omegaconf import MISSING

from opd.config.checks import Check, at_least, checked, nonempty, one_of


def _placeholders(template: str) -> set[str]:
    """The `$name` / `${name}` placeholders of a `string.Template` text."""
    return {m.group("named") or m.group("braced") for m in Template.pattern.finditer(template) if m.group("named") or m.group("braced")}


@dataclass
class ModelInlineMath:
    """model.inline_math: budgets and sampling of env=inline_math with this model."""

    max_model_len: int = checked(at_least(16))
    max_tool_calls: int = MISSING
    max_tokens_per_segment: int = MISSING
    max_new_tokens: int = MISSING
    temperature: float = MISSING
    tool_instruction: bool = MISSING


@dataclass
class ModelSampling:
    """model.sampling: the vendor's recommended sampling, in both environments (null: not sent,
    so the model's own generation_config.json decides)."""

    top_p: Optional[float] = MISSING
    top_k: Optional[int] = MISSING
    min_p: Optional[float] = MISSING
    eval_temperature: float = MISSING


@dataclass
class ModelCoding:
    """model.opd_coding: budgets and sampling of env=opd_coding with this model."""

    max_model_len: int = checked(at_least(16))
    max_turns: int = MISSING
    max_tokens_per_turn: int = MISSING
    temperature: float = MISSING
    judge_max_tokens: int = MISSING
    show_tests: bool = MISSING


@dataclass
class ModelConfig:
    """model=<preset>: the model family's formats and budgets (conf/model/fixture.yaml documents
    each field). The envs, the server and the judge read their defaults from here."""

    name: str = MISSING
    path: str = MISSING
    dtype: str = MISSING
    tool_call_parser: str = checked(nonempty("a vLLM --tool-call-parser name"))
    reasoning_parser: Optional[str] = MISSING
    tool_call_start: str = checked(nonempty("a non-empty marker"))
    tool_call_end: str = checked(nonempty("a non-empty marker"))
    call_template: str = checked(Check("a template with $arguments and $name (JSON) or $function (bare)",
                                       lambda v: "$arguments" in v and ("$name" in v or "$function" in v)))
    tool_response_template: str = checked(Check("a template with $result (and no placeholders but $result, $function and $call_id)",
                                                lambda v: "$result" in v and _placeholders(v) <= {"result", "function", "call_id"}))
    required_tokens: list[str] = MISSING
    chat_template: Optional[str] = MISSING
    chat_template_kwargs: dict[str, Any] = MISSING
    tool_call_ids: Optional[str] = checked(one_of("mistral"), null="none")
    startup_timeout_s: float = checked(at_least(1))
    reasoning_end: str = MISSING
    sampling: ModelSampling = MISSING
    inline_math: ModelInlineMath = MISSING
    opd_coding: ModelCoding = MISSING
