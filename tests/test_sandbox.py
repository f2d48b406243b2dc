"""The python sandbox: output, limits, isolation; every run contained and reported."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

from conftest import sandbox_limits
from opd.tools.sandbox import run_python

FAST = sandbox_limits(timeout_s=3, cpu_s=3, memory_mb=512, output_chars=500)


def run(code: str, limits=FAST):
    return asyncio.run(run_python(code, limits))


def test_prints_stdout_and_last_expression() -> None:
    result = run("x = 6\nprint('hello')\nx * 7")
    assert result.error is None and result.exit_code == 0
    assert result.stdout == "hello\n42\n"


def test_exceptions_come_back_as_stderr() -> None:
    result = run("1 / 0")
    assert result.exit_code == 1 and "ZeroDivisionError" in result.stderr and result.error == "exited with code 1"


def test_infinite_loop_is_killed_at_the_timeout() -> None:
    started = time.monotonic()
    result = run("while True: pass", sandbox_limits(timeout_s=2, cpu_s=30))
    assert result.timed_out and "timed out" in (result.error or "")
    assert time.monotonic() - started < 6


def test_memory_bomb_fails_inside_the_sandbox() -> None:
    result = run("a = bytearray(4 * 1024 ** 3)")
    assert result.error is not None and "MemoryError" in result.stderr


def test_gigantic_output_is_truncated() -> None:
    result = run("print('x' * 10_000_000)")
    assert len(result.stdout) < 600 and "truncated" in result.stdout


def test_environment_is_scrubbed() -> None:
    os.environ["OPD_SECRET_FOR_TEST"] = "hunter2"
    result = run("import os; print(sorted(os.environ))")
    assert "OPD_SECRET_FOR_TEST" not in result.stdout and "hunter2" not in result.stdout


def test_network_is_unreachable() -> None:
    result = run("import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=2)")
    assert result.error is not None and ("unreachable" in result.stderr or "refused" not in result.stderr)


@pytest.fixture()
def shared_dir() -> Iterator[Path]:
    """A directory the sandbox user may write to (like /tmp itself)."""
    path = Path(tempfile.mkdtemp(prefix="opd-test-shared-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_background_processes_are_killed_when_the_call_ends(shared_dir: Path) -> None:
    marker = shared_dir / "alive"
    child = f"import time, pathlib\nwhile True:\n    time.sleep(0.1)\n    pathlib.Path({str(marker)!r}).touch()\n"
    code = (
        f"import os, subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', {child!r}])\n"
        f"for _ in range(100):\n    if os.path.exists({str(marker)!r}): break\n    time.sleep(0.05)\n"
        f"print('started' if os.path.exists({str(marker)!r}) else 'never ran')\n"
    )
    result = run(code)
    assert result.stdout.strip() == "started", result.stderr
    time.sleep(0.5)
    marker.unlink(missing_ok=True)
    time.sleep(0.5)
    assert not marker.exists(), "a background process outlived the tool call"


def test_works_in_its_own_directory_which_is_removed() -> None:
    result = run("import os; print(os.getcwd()); open('f.txt', 'w').write('x')")
    workdir = result.stdout.strip()
    assert "opd-sandbox-" in workdir and not os.path.exists(workdir)


@pytest.mark.parametrize("size_mb", [64])
def test_disk_filler_is_stopped_by_the_file_size_limit(size_mb: int) -> None:
    result = run(f"open('big', 'wb').write(b'0' * ({size_mb} * 1024 * 1024))", sandbox_limits(timeout_s=5, file_size_mb=4))
    assert result.error is not None


def test_the_limits_are_in_force_inside() -> None:
    # Whichever way the child was started (the exec chain sh -> prlimit -> unshare, or the
    # preexec fallback), the code sees the configured limits, its own PID namespace and user.
    limits = sandbox_limits(cpu_s=7, memory_mb=512, file_size_mb=4, max_open_files=32)
    code = (
        "import os, resource\n"
        "print([resource.getrlimit(r) for r in (resource.RLIMIT_CPU, resource.RLIMIT_AS, resource.RLIMIT_FSIZE, resource.RLIMIT_NOFILE, resource.RLIMIT_CORE)])\n"
        "print(os.getpid(), os.getuid())\n"
    )
    result = asyncio.run(run_python(code, limits))
    assert result.error is None, result
    rlimits, ids = result.stdout.splitlines()
    mib = 1024 * 1024
    assert rlimits == str([(7, 8), (512 * mib, 512 * mib), (4 * mib, 4 * mib), (32, 32), (0, 0)])
    pid, uid = ids.split()
    from opd.tools.sandbox import _unshare, sandbox_plan

    if _unshare() is not None:
        assert pid == "1"  # first process of a new PID namespace
    plan_ids, _ = sandbox_plan(limits.user)
    assert int(uid) == (plan_ids[0] if plan_ids else os.getuid())
