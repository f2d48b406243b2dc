"""The runner's schema (conf/runner/): the generation loop and the Ray cluster of its workers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from omegaconf import MISSING

from opd.config.checks import above, at_least, checked


@dataclass
class RayConfig:
    """runner.workers > 1: the Ray cluster the environment workers run on (conf/runner/default.yaml)."""

    address: Optional[str] = MISSING
    num_cpus: Optional[int] = checked(at_least(1), null="workers x cpus_per_worker")
    cpus_per_worker: float = checked(above(0))
    object_store_mb: int = checked(at_least(75))  # Ray's own minimum
    startup_timeout_s: float = checked(above(0))
    max_restarts: int = checked(at_least(0))


@dataclass
class RunnerConfig:
    """The generation loop (conf/runner/default.yaml)."""

    groups_in_flight: Optional[int] = checked(at_least(1), null="from the servers' request slots")
    oversubscribe: float = checked(at_least(1))
    uvloop: bool = MISSING
    max_attempts_per_item: int = checked(at_least(1))
    max_failed_groups: int = checked(at_least(0))
    max_dropped_groups: Optional[int] = checked(at_least(0), null="10 x total_steps")
    progress: bool = MISSING
    progress_every: int = checked(at_least(1))
    quiet_after_s: Optional[float] = checked(above(0), null="no line while no group is written")
    fsync: bool = MISSING
    workers: int = checked(at_least(1))
    ray: RayConfig = MISSING
