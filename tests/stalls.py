"""How long a coroutine keeps the event loop from running anything else.

A ticker task wakes every millisecond; between two of its wakes the loop ran something else. The
stall of such a gap is the CPU time the loop's thread spent in it (`time.thread_time`): what the
code under test computed on the loop. CPU time, not wall time, so that a machine loaded by other
jobs (the ticker's thread waiting for a core) does not read as a stall; the wall gap is kept too.
The objects alive before a call are frozen (`gc.freeze`): a full garbage collection of the test
process's heap (60-100 ms under pytest), which any allocation may start, is not the call's stall.
"""

from __future__ import annotations

import asyncio
import gc
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

# The most CPU seconds any tool, parser or reward may hold the event loop in one go.
STALL_LIMIT_S = 0.05


@dataclass
class Stalls:
    """The worst gap between two ticks over all calls measured: loop CPU and wall seconds."""

    cpu_s: float = 0.0
    wall_s: float = 0.0
    calls: int = 0
    worst_call: str = ""

    def report(self, what: str) -> str:
        return (f"{what}: {self.calls} calls, worst stall {self.cpu_s * 1000:.1f} ms of loop CPU ({self.wall_s * 1000:.1f} ms wall) "
                f"in {self.worst_call[:80]!r}; limit {STALL_LIMIT_S * 1000:.0f} ms of loop CPU")


async def _measured(call: Awaitable[Any]) -> tuple[Any, float, float]:
    """`call`'s result and its worst gap between ticks: (result, loop CPU s, wall s)."""
    worst = [0.0, 0.0]
    ticking = asyncio.Event()

    async def tick() -> None:
        last_wall, last_cpu = time.monotonic(), time.thread_time()
        ticking.set()
        while True:
            await asyncio.sleep(0.001)
            wall, cpu = time.monotonic(), time.thread_time()
            worst[0], worst[1] = max(worst[0], cpu - last_cpu), max(worst[1], wall - last_wall)
            last_wall, last_cpu = wall, cpu

    ticker = asyncio.create_task(tick())
    await ticking.wait()
    try:
        result = await call
        await asyncio.sleep(0.002)  # one more tick: the gap that ends with the call's last step
    finally:
        ticker.cancel()
    return result, worst[0], worst[1]


def measure(stalls: Stalls, label: str, make: Callable[[], Awaitable[Any]]) -> Any:
    """Run `make()` on a fresh event loop beside the ticker; fold its worst gap into `stalls`."""
    gc.freeze()  # only what the call allocates is collected during it
    result, cpu, wall = asyncio.run(_measured(make()))
    stalls.calls += 1
    if cpu > stalls.cpu_s:
        stalls.cpu_s, stalls.worst_call = cpu, label
    stalls.wall_s = max(stalls.wall_s, wall)
    return result
