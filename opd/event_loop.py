"""The event loop a run uses: uvloop where it is installed (vLLM depends on it), else asyncio's.

uvloop's transports and scheduling cost less CPU per HTTP request than asyncio's own loop, and a
single process's request rate is bounded by that CPU: `python -m experiments.bench overhead` at
32 requests in flight and 100 ms per request reached 71% of the ideal rate on asyncio's loop and
88% on uvloop (env CPU 2.9 vs 1.7 ms per rollout, one run each, 2-core machine).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable, TypeVar

logger = logging.getLogger(__name__)
T = TypeVar("T")


def loop_factory(use_uvloop: bool = True) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop factory, or None (asyncio's default) when off or not installed."""
    if not use_uvloop:
        return None
    try:
        import uvloop
    except ImportError:
        logger.info("uvloop is not installed; using asyncio's default event loop")
        return None
    return uvloop.new_event_loop


def run_loop(main: Awaitable[T], use_uvloop: bool = True) -> T:
    """`asyncio.run(main)` on the chosen loop (Ctrl-C cancels `main` the same way on both)."""
    with asyncio.Runner(loop_factory=loop_factory(use_uvloop)) as runner:
        return runner.run(main)  # type: ignore[arg-type]

