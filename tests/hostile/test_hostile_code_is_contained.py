"""Hostile programs are contained and reported, beside normal calls that must not notice them; what
stopped a call is said in words, by the terminal too; a cancelled call leaves nothing running
(docs/guarantees.md, "Sandbox")."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time

import pytest

from conftest import one_fast, sandbox_limits
from hostile.common import LIMITS, SECRET, call, workspace, _sleepers, CORPUS, program
from opd.jail.sandbox import run_python

# The leftover check (hostile/conftest.py) scans the whole machine: these tests run on one xdist worker.
pytestmark = pytest.mark.xdist_group("hostile")

# ---- hostile programs beside normal ones -----------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CORPUS))
def test_python_tool_contains_and_reports(name: str) -> None:
    result = asyncio.run(run_python(program(name), LIMITS))
    assert result.error is not None, (name, result)
    assert SECRET not in result.stdout + result.stderr
    assert len(result.stdout) <= LIMITS.output_chars + 60 and len(result.stderr) <= LIMITS.output_chars + 60
    assert result.wall_s < LIMITS.timeout_s + 5
    assert asyncio.run(run_python("1 + 1", LIMITS)).stdout.strip() == "2"  # the next call works


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CORPUS))
def test_agent_terminal_contains_and_reports(name: str) -> None:
    with workspace(max_file_chars=5000) as (_, tools):
        assert call(tools, "write_file", path="evil.py", content=program(name)).startswith("wrote")
        output = call(tools, "terminal", command="python evil.py")
        status = re.search(r"\[(exit code (-?\d+)|timed out after [\d.]+ s)[^\]]*\]$", output)
        assert status is not None, output[-300:]
        assert status.group(2) != "0", output[-300:]
        assert len(output) <= 2 * LIMITS.output_chars + 300
        assert SECRET not in output
        assert call(tools, "terminal", command="echo fine") == "fine\n[exit code 0]"


@pytest.mark.slow
def test_sixteen_hostile_calls_beside_sixteen_normal_ones_leave_the_normal_ones_alone() -> None:
    hostile = ["fork_bomb", "memory_bomb", "disk_filler", "gigantic_output", "infinite_loop", "shm_filler", "kill_the_launcher", "double_fork_daemon"] * 2
    normal = "import math\nprint(sum(i * i for i in range(1000)), math.factorial(10))"

    async def together() -> list:
        calls = [run_python(program(name), LIMITS) for name in hostile] + [run_python(normal, sandbox_limits(timeout_s=60)) for _ in range(16)]
        return await asyncio.gather(*calls)

    results = asyncio.run(together())
    for result in results[16:]:
        assert result.error is None and result.stdout == "332833500 3628800\n", result
    assert all(result.error is not None for result in results[:16])


def test_a_cancelled_call_leaves_nothing_running() -> None:
    # A run that ends (server lost, Ctrl-C) cancels its rollouts in the middle of tool calls.
    code = "import subprocess, time\nsubprocess.Popen(['sleep', '987'], start_new_session=True)\ntime.sleep(600)\n"

    async def cancel_midway() -> None:
        task = asyncio.create_task(run_python(code, LIMITS))
        await asyncio.sleep(1.0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(cancel_midway())
    deadline = time.monotonic() + 5
    while _sleepers() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _sleepers() == []


TERMINAL_STOPS = {
    # command, limits, words the status must hold
    "segfault": ("python -c 'import ctypes; ctypes.string_at(0)'", LIMITS, "killed by SIGSEGV"),
    "cpu_limit": ("while :; do :; done", sandbox_limits(timeout_s=20, cpu_s=1), "CPU limit (1 s)"),
    "file_size": ("head -c 3000000 /dev/zero > big", sandbox_limits(file_size_mb=1), "file-size limit (1 MiB per file)"),
    "abort": ("python -c 'import os; os.abort()'", LIMITS, "killed by SIGABRT"),
}


@pytest.mark.parametrize("name", one_fast(sorted(TERMINAL_STOPS), ("abort",)))
def test_the_terminal_names_what_stopped_a_command(name: str) -> None:
    command, limits, words = TERMINAL_STOPS[name]
    with workspace(limits) as (_, tools):
        output = call(tools, "terminal", command=command)
    status = output.rsplit("[", 1)[-1]
    assert words in status, output[-300:]
