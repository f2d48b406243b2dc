"""Tool calls: the round trip of one sandboxed call (python tool, agent terminal), a passing and a
failing one side by side, one at a time and several at once."""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any, Awaitable, Callable, Iterator

from experiments.bench.common import compose, median

# What each tool runs: (passing, failing). A failing call (a non-zero exit: a failing test run, a
# grep that finds nothing, a missing file) is a coding agent's most common call.
PROGRAMS = {"python": ("1 + 1", "raise SystemExit(1)"), "terminal": ("true", "exit 1")}


async def _round_trips(calls: int, concurrency: int, make: Callable[[], Awaitable[Any]]) -> list[float]:
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
    """Median wall seconds per call of a passing and a failing program (`PROGRAMS`) in the python
    tool and in a workspace terminal, one at a time and `concurrency` at a time (as a run's
    rollouts make them); the two alternate run by run (passing, failing, failing, passing, ...), so
    load that comes and goes falls on both. `fail_over_pass` is the ratio of their medians."""
    from opd.event_loop import run_loop
    from opd.jail.sandbox import run_python
    from opd.tools.workspace import Workspace

    limits = compose(["env=opd_coding"], overrides).env.sandbox
    for at_once in concurrency:
        # One workspace per rollout in flight (a rollout's own calls come one after another).
        workspaces = [Workspace(limits) for _ in range(at_once)]
        free = list(workspaces)

        def terminal(command: str) -> Callable[[], Awaitable[Any]]:
            async def call() -> None:
                workspace = free.pop()
                try:
                    await workspace.terminal(command)
                finally:
                    free.append(workspace)
            return call

        def python(code: str) -> Callable[[], Awaitable[Any]]:
            return lambda: run_python(code, limits)

        try:
            for name, make in (("python", python), ("terminal", terminal)):
                passing, failing = (make(program) for program in PROGRAMS[name])
                runs: dict[str, list[list[float]]] = {"passing": [], "failing": []}
                for repeat in range(repeats):
                    order = ("passing", "failing") if repeat % 2 == 0 else ("failing", "passing")
                    for which in order:
                        runs[which].append(run_loop(_round_trips(calls, at_once, passing if which == "passing" else failing)))
                result: dict[str, Any] = {"bench": "tools", "tool": name, "concurrency": at_once, "calls": calls,
                                          "programs": dict(zip(("passing", "failing"), PROGRAMS[name]))}
                for which, measured in runs.items():
                    per_run = [statistics.median(r) for r in measured]
                    result[f"{which}_median_s"] = median(per_run)
                    result[f"{which}_p90_s"] = median([sorted(r)[int(0.9 * len(r))] for r in measured])
                    result[f"{which}_runs"] = [round(x, 4) for x in per_run]
                result["fail_over_pass"] = round(result["failing_median_s"] / result["passing_median_s"], 3)
                yield result
        finally:
            run_loop(_close_all(workspaces))
