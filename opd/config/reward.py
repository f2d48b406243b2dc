"""The rewards' schemas (conf/reward/): each signal's weight and parameters, per environment."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from omegaconf import MISSING

from opd.config.checks import Check, at_least, at_most, checked, each, fraction, join, one_of, relation, require


@dataclass
class InlineMathWeights:
    """reward.weights of inline_math: one weight per signal of `opd.rewards.math`."""

    correct: float = MISSING
    incorrect: float = MISSING
    tool_use: float = checked(at_least(0))
    format_violation: float = checked(at_most(0))


@dataclass
class InlineMathRewardConfig:
    """reward=inline_math (conf/reward/inline_math.yaml)."""

    weights: InlineMathWeights = MISSING
    format_penalty: str = checked(one_of("flat", "additive"))
    flat_format_score: float = MISSING
    max_answer_chars: int = checked(at_least(1))
    verify_timeout_s: float = checked(at_least(0.1))
    verify_workers: int = checked(at_least(1))


@relation(InlineMathWeights)
def correct_above_incorrect(weights: InlineMathWeights, at: str) -> None:
    require(weights.correct > weights.incorrect, join(at, "correct"), f"> {join(at, 'incorrect')}", weights.correct)


@dataclass
class CodingWeights:
    """reward.weights of opd_coding: one weight per signal of `opd.rewards.coding`."""

    correctness: float = checked(at_least(0))
    efficiency: float = checked(at_least(0))
    tool_usage: float = checked(at_least(0))


@dataclass
class CorrectnessLevels:
    passed: float = checked(fraction())
    assertion: float = checked(fraction())
    crash: float = checked(fraction())
    nothing_written: float = checked(fraction())


@dataclass
class Efficiency:
    best_turns: int = checked(at_least(0))
    steps: list[list[float]] = checked(each(Check("[fraction in (0, 1], score in [0, 1]] pairs",
                                                  lambda s: len(s) == 2 and 0 < s[0] <= 1 and 0 <= s[1] <= 1)))
    floor: float = checked(fraction())


@dataclass
class ToolUsage:
    write_and_run: float = checked(fraction())
    run_only: float = checked(fraction())
    other: float = checked(fraction())


@dataclass
class OPDCodingRewardConfig:
    """reward=opd_coding (conf/reward/opd_coding.yaml)."""

    weights: CodingWeights = MISSING
    correctness_levels: CorrectnessLevels = MISSING
    efficiency: Efficiency = MISSING
    tool_usage: ToolUsage = MISSING
    tests_timeout_s: float = checked(at_least(1))
    max_solution_chars: int = checked(at_least(1))
    clamp: Optional[list[float]] = checked(Check("[low, high] with low <= high", lambda c: len(c) == 2 and c[0] <= c[1]), null="not clamped")
    pass_threshold: float = checked(fraction())
