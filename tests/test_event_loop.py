"""opd.event_loop.interrupt: a stop asked while run_loop runs cancels its main task, and run_loop
ends in KeyboardInterrupt with the reason; elsewhere, and at a second stop, it raises at once."""

from __future__ import annotations

import asyncio

import pytest

from opd.event_loop import interrupt, run_loop


@pytest.mark.parametrize("use_uvloop", [True, False])
def test_a_stop_cancels_the_main_task_at_its_next_await_and_run_loop_raises_its_reason(use_uvloop: bool) -> None:
    reached: list[str] = []

    async def run() -> None:
        interrupt("stop asked")  # returns: the task goes on to its next await
        reached.append("after the stop")
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            reached.append("cancelled")
            raise
        reached.append("slept")

    with pytest.raises(KeyboardInterrupt, match="stop asked"):
        run_loop(run(), use_uvloop)
    assert reached == ["after the stop", "cancelled"]


def test_a_main_that_swallows_its_cancellation_still_ends_interrupted() -> None:
    async def stubborn() -> str:
        interrupt("stop asked")
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            return "carried on"
        return "slept"

    with pytest.raises(KeyboardInterrupt, match="stop asked"):
        run_loop(stubborn())


def test_a_second_stop_and_a_stop_outside_the_loop_raise_at_once() -> None:
    async def twice() -> None:
        interrupt("first")
        with pytest.raises(KeyboardInterrupt, match="second"):
            interrupt("second")
        await asyncio.sleep(10)

    with pytest.raises(KeyboardInterrupt, match="first"):
        run_loop(twice())
    with pytest.raises(KeyboardInterrupt, match="outside"):
        interrupt("outside")
    assert run_loop(asyncio.sleep(0, "done")) == "done"  # the stop is not left behind for the next loop
