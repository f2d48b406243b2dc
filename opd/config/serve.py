"""The serve section's schema (conf/config.yaml, `serve`): the Atropos trainer API of mode=serve."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import MISSING

from opd.config.checks import above, at_least, checked, url


@dataclass
class ServeConfig:
    """mode=serve: the Atropos trainer API (conf/config.yaml, `serve`)."""

    rollout_server_url: str = checked(url())
    env_name: str = MISSING
    weight: float = checked(above(0))
    max_batches_offpolicy: int = checked(at_least(1))
    poll_interval_s: float = checked(above(0))
    wait_timeout_s: float = checked(above(0))
    request_timeout_s: float = checked(above(0))
    max_attempts: int = checked(at_least(1))
