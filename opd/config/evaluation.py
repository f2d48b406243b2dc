"""The eval section's schema (conf/config.yaml, `eval`): evaluation of the held-out split."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from omegaconf import MISSING

from opd.config.checks import at_least, checked, within


@dataclass
class EvalConfig:
    """Evaluation of the held-out split (conf/config.yaml, `eval`)."""

    every: Optional[int] = checked(at_least(1), null="only with mode=evaluate")
    samples_per_item: int = checked(at_least(0))
    temperature: float = checked(within(0, 5))
    max_items: Optional[int] = checked(at_least(1), null="all")
    seed: Optional[int] = checked(within(0, 2**31, "[)"), null="unseeded")
    confidence: float = checked(within(0, 1, "()"))
    teacher: bool = MISSING
