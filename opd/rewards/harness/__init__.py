"""The coding reward's test harness: a verdict no solution can forge.

The task's tests and the agent's solution run in two jails, as two uids, in two PID namespaces:
- the solution's jail (`solution_server.py`) holds only `solution.py`; it imports it and runs its
  functions on request, sending back plain data (`wire.py`);
- the tests' jail (`test_runner.py`) holds only the tests; it gives them a stand-in `solution`
  module whose functions ask the other jail, runs them, and writes the verdict to a pipe only it
  holds, which this module reads.
The solution never runs where the assertions run, cannot see the tests, the verdict pipe or the
tests' process, and only ever returns data: printing a success line, exiting with 0, returning an
object whose `__eq__` says yes or patching `assert` changes nothing. The verdict does not depend on
how much either side prints. Limits: the tests may only pass data to the solution's functions and
get data back (no callbacks, no objects of the solution's classes, no in-place mutation seen by
the tests).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from opd.config import SandboxConfig
from opd.jail.call_dirs import launcher_dirs
from opd.jail.capture import read_cut
from opd.jail.command import Jail, interpreter, spawn
from opd.jail.reaping import exited, stop
from opd.jail.uids import UidLease

HERE = Path(__file__).resolve().parent
_SCRIPTS = ("wire.py", "solution_server.py", "test_runner.py")


@dataclass(frozen=True)
class TestOutcome:
    """How the task's tests went: pass | assertion | crash | nothing_written, and why."""

    level: str
    detail: str


def _put(directory: Path, name: str, text: str, uid: int | None) -> None:
    fd = os.open(directory / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
        if uid is not None:
            os.fchown(handle.fileno(), uid, uid)


async def run_tests(solution: str, tests: str, limits: SandboxConfig) -> TestOutcome:
    """Run `tests` against `solution` (the source of solution.py) as described above; the jails
    get `limits`, their wall clock included."""
    python = interpreter()[0]
    dirs = launcher_dirs()
    leases: list[UidLease] = []
    roots: list[Path] = []
    capture: Path | None = None
    fds: list[int] = []
    jails: list[Jail] = []
    try:
        leases = [UidLease.take(limits.uid_base), UidLease.take(limits.uid_base)]
        # Each jail's directory, /tmp and /dev/shm: one tmpfs of tmp_mb and tmp_files (as root).
        server_root, server = dirs.area("solution-", leases[0].uid, limits)
        roots.append(server_root)
        tests_root, tested = dirs.area("tests-", leases[1].uid, limits)
        roots.append(tests_root)
        server_dir, tests_dir = server.work, tested.work
        capture = dirs.scratch("harness-")
        scripts = {name: (HERE / name).read_text(encoding="utf-8") for name in _SCRIPTS}
        for name in ("wire.py", "solution_server.py"):
            _put(server_dir, name, scripts[name], None)
        _put(server_dir, "solution.py", solution, leases[0].uid)
        for name in ("wire.py", "test_runner.py"):
            _put(tests_dir, name, scripts[name], None)
        _put(tests_dir, "tests.py", tests, None)
        requests_r, requests_w = os.pipe()
        answers_r, answers_w = os.pipe()
        verdict_r, verdict_w = os.pipe()
        fds = [requests_r, requests_w, answers_r, answers_w, verdict_r, verdict_w]
        # What the solution prints goes nowhere: it can print without limit, and it decides nothing.
        jails.append(spawn([python, "-I", "solution_server.py", str(requests_r), str(answers_w)], server, limits, leases[0].uid,
                           subprocess.DEVNULL, subprocess.DEVNULL, pass_fds=(requests_r, answers_w)))
        with open(capture / "tests", "wb") as out:
            jails.append(spawn([python, "-I", "test_runner.py", str(requests_w), str(answers_r), str(verdict_w), "tests.py"], tested, limits,
                               leases[1].uid, out, out, pass_fds=(requests_w, answers_r, verdict_w)))
        for fd in (requests_r, requests_w, answers_r, answers_w, verdict_w):  # only the jails hold them now
            os.close(fd)
        fds = [verdict_r]
        os.set_blocking(verdict_r, False)
        try:
            await asyncio.wait_for(exited(jails[1].proc), timeout=limits.timeout_s)
        except asyncio.TimeoutError:
            return TestOutcome("crash", f"the tests did not finish within {limits.timeout_s:g} s")
        verdict = _read_verdict(verdict_r)
        if verdict is None:
            return TestOutcome("crash", "the tests ended without a verdict: " + read_cut(capture / "tests", 1000))
        return verdict
    finally:
        try:
            # Both jails at once; each group is killed before its leader is reaped, and nothing of
            # a uid outlives its lease.
            await asyncio.gather(*(stop(jail, lease.uid) for jail, lease in zip(jails, leases)))
            for fd in fds:
                os.close(fd)
            if capture is not None:
                shutil.rmtree(capture, ignore_errors=True)
            await asyncio.gather(*(dirs.remove(root) for root in roots))
        finally:
            for lease in leases:
                lease.release()


def _read_verdict(fd: int) -> TestOutcome | None:
    """The verdict the tests' process wrote (it has exited: the pipe reads to its end at once)."""
    data = b""
    try:
        while len(data) <= 65536 and (chunk := os.read(fd, 65536)):
            data += chunk
    except BlockingIOError:  # still held open by something of the jail's: no complete verdict
        return None
    try:
        verdict = json.loads(data)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, an int too long to convert, too deep
        return None
    if not isinstance(verdict, dict) or verdict.get("level") not in ("pass", "assertion", "crash"):
        return None
    return TestOutcome(verdict["level"], str(verdict.get("detail", ""))[:2000])
