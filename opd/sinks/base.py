"""The sink interface: what the runner hands each written group to.

Sinks are opened before the first group and closed after the last, also when the run fails or is
killed (`close` gets the run's final status). The runner calls `write` on each sink in order, the
JSONL file first, so a group is on disk before anything else sees it; awaiting `write` is
back-pressure (the Atropos sink waits there for its trainer). A sink that raises fails the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Written:
    """One group the runner accepted, with its position and metrics."""

    group: dict[str, Any]
    # Groups written so far, this one included (1-based; a resumed run continues its count).
    step: int
    # The environment's per-group metrics and the runner's (MLflow metric names).
    metrics: dict[str, float]


class Sink:
    """Base class: every method is optional."""

    async def open(self) -> None:
        """Connect, create files; called once before the first group."""

    async def write(self, written: Written) -> None:
        """Take one written group."""

    async def server_restarted(self) -> None:
        """The embedded inference server was restarted and serves the weights it started with."""

    async def close(self, status: str) -> None:
        """Flush and release; `status` is FINISHED, FAILED or KILLED."""

    def summary(self) -> dict[str, float]:
        """`summary/*` metrics this sink adds to the run's summary."""
        return {}
