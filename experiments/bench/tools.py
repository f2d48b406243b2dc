"""Tool calls: the round trip of one sandboxed call (python tool, agent terminal), sequential and
with several at once."""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any, Iterator

from experiments.bench.common import compose, median


async def _round_trips(calls: int, concurrency: int, make: Any) -> list[float]:
    slots = asyncio.Semaphore(concurrency)

    async def one() -> float:
        async with slots:
            started = time.perf_counter()
            await make()
            return time.perf_counter() - started

    return await asyncio.gather(*(one() for _ in range(calls)))


async def _close_all(workspaces: list[Any]) -> None:
    await asyncio.gather(*(workspace.close() for workspace in workspaces))


def bench_tools(repeats: int, calls: int = 40, concurrency: tuple[int, ...] = (1, 8), overrides: tuple[str, ...] = ()) -> Iterator[dict[str, Any]]:
    """Median wall seconds per call of `1 + 1` in the python tool and of `echo ok` in a workspace
    terminal, one at a time and `concurrency` at a time (as a run's rollouts make them)."""
    from opd.event_loop import run_loop
    from opd.tools.sandbox import run_python
    from opd.tools.workspace import Workspace

    limits = compose(["env=opd_coding"], overrides).env.sandbox
    for at_once in concurrency:
        # One workspace per rollout in flight (a rollout's own calls come one after another).
        workspaces = [Workspace(limits) for _ in range(at_once)]
        free = list(workspaces)

        async def terminal() -> None:
            workspace = free.pop()
            try:
                await workspace.terminal("echo ok")
            finally:
                free.append(workspace)

        try:
            for name, make in (("python", lambda: run_python("1 + 1", limits)), ("terminal", terminal)):
                runs = [run_loop(_round_trips(calls, at_once, make)) for _ in range(repeats)]
                per_run = [statistics.median(r) for r in runs]
                yield {"bench": "tools", "tool": name, "concurrency": at_once, "calls": calls,
                       "median_s": median(per_run), "p90_s": median([sorted(r)[int(0.9 * len(r))] for r in runs]), "runs": [round(x, 4) for x in per_run]}
        finally:
            run_loop(_close_all(workspaces))
