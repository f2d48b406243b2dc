"""The event loop a run uses, and how a stop signal reaches the run on it.

uvloop where it is installed (vLLM depends on it), else asyncio's. uvloop's transports and
scheduling cost less CPU per HTTP request than asyncio's own loop, and a single process's request
rate is bounded by that CPU: `python -m experiments.bench overhead` at 32 requests in flight and
100 ms per request reached 71% of the ideal rate on asyncio's loop and 88% on uvloop (env CPU 2.9 vs
1.7 ms per rollout, one run each, 2-core machine).

A stop signal (SIGTERM, Slurm's warning) goes through `interrupt`. While `run_loop` runs in the main
thread, the first one cancels the loop's main task, as asyncio itself does on Ctrl-C: the run stops
at its next `await` and unwinds (groups in flight cancelled, sinks closed KILLED), and `run_loop`
then raises KeyboardInterrupt with the signal's reason. An exception raised by the signal handler
itself lands between any two bytecodes of whatever the main thread runs: inside the loop's own
bookkeeping (a callback taken off the ready queue and never run) or in a section between taking a
lock and the `try` that gives it back, code that was not written to be interrupted. Outside the
loop, or at a second signal, the handler raises at once (as a second Ctrl-C does).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass
from typing import Awaitable, Callable, TypeVar

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class _Running:
    """The main thread's `run_loop`: its loop, main task and the stop asked of it, if any."""

    loop: asyncio.AbstractEventLoop
    task: asyncio.Task
    reason: str | None = None


_running: _Running | None = None


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
    """`asyncio.run(main)` on the chosen loop. Ctrl-C, and a stop signal sent through `interrupt`,
    cancel `main` the same way on both loops; then this raises KeyboardInterrupt."""
    global _running
    with asyncio.Runner(loop_factory=loop_factory(use_uvloop)) as runner:
        if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
            return runner.run(main)  # type: ignore[arg-type]

        async def registered() -> T:
            global _running
            running = _Running(asyncio.get_running_loop(), asyncio.current_task())  # type: ignore[arg-type]
            _running = running
            return await main

        try:
            result = runner.run(registered())
        except asyncio.CancelledError:
            stop = _running.reason if _running is not None else None
            if stop is not None:
                logger.info("stopped: %s", stop)
                raise KeyboardInterrupt(stop) from None
            raise
        finally:
            stopped, _running = _running, None
        if stopped is not None and stopped.reason is not None:
            raise KeyboardInterrupt(stopped.reason)  # the main coroutine returned though asked to stop
        return result


def interrupt(reason: str) -> None:
    """Stop the run, from a signal handler (main thread): while `run_loop` runs, cancel its main
    task at its next await and return; otherwise, or when a stop was asked already, raise
    KeyboardInterrupt(reason) here."""
    running = _running
    if running is None or running.reason is not None or running.task.done():
        raise KeyboardInterrupt(reason)
    running.reason = reason  # no logging here: the main thread may be inside a handler's emit
    running.loop.call_soon_threadsafe(running.task.cancel, reason)
