"""The sweep section's schema (conf/config.yaml, `sweep`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from omegaconf import MISSING

from opd.config.checks import at_least, checked


@dataclass
class SweepConfig:
    """Sweeps (conf/config.yaml, `sweep`)."""

    share_server: bool = MISSING
    objective: Optional[str] = MISSING
    seeds: int = checked(at_least(1))
