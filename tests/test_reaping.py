"""A jailed call ends as soon as its processes are gone, whatever its exit status, and nothing of it
accumulates: when a call returns no process of its uid is left (zombies included), and a closed
workspace leaves no control group, mount, directory or uid lease behind. Hostile programs try to
outlive their call: daemons in new sessions, processes that ignore signals, double forks, a
filled process limit, a call that runs past its wall clock (opd.jail.reaping, opd.jail.command)."""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from pathlib import Path

import pytest

from conftest import one_fast, sandbox_limits
from opd.event_loop import run_loop
from opd.jail import cgroups, command, reaping
from opd.jail.call_dirs import launcher_dirs
from opd.jail.command import Jail
from opd.jail.reaping import processes_of
from opd.tools.workspace import Workspace

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="a uid of the call's own needs a root launcher")
LIMITS = sandbox_limits(timeout_s=2, cpu_s=2, memory_mb=256, max_processes=16, output_chars=300)
# `sleep 8765`: not the hostile corpus's `sleep 987`, which tests/hostile/ looks for machine-wide.
HOSTILE = {
    "exit_1": ("exit 1", "exit code 1"),
    "killed_by_a_signal": ("kill -SEGV $$", "exit code 139"),
    "daemon_in_a_new_session_ignoring_signals": ("(trap '' TERM HUP INT; exec setsid sleep 8765 &) ; exit 3", "exit code 3"),
    "double_fork": ("( ( sleep 8765 & ) & ) ; exit 4", "exit code 4"),
    "process_limit_filled": ("python -c \"import os, time\nfor i in range(40):\n    try:\n        if os.fork() == 0:\n            time.sleep(8765)\n"
                             "    except OSError:\n        os._exit(5)\n\"", "exit code 5"),
    "a_thread_runs_on_after_the_main_thread_exits": (
        "python -c \"import ctypes, threading, time\nthreading.Thread(target=time.sleep, args=(8765,)).start()\nctypes.CDLL(None).pthread_exit(None)\"",
        "timed out"),
    "past_the_wall_clock": ("sleep 8765 & sleep 8765", "timed out"),
}


def _left(uid: int) -> list[str]:
    """What /proc shows of `uid`'s processes: pid, state and name."""
    found = []
    for pid in processes_of(uid):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        found.append(f"{pid} {stat[stat.rindex(')') + 2]} {stat[stat.index('(') + 1:stat.rindex(')')]}")
    return found


def _leftovers() -> dict[str, list[str]]:
    """What this launcher's closed workspaces and ended calls may have left: control groups,
    mounts and entries in its directory of call directories."""
    root = launcher_dirs().root
    groups = [d.name for c in cgroups.CONTROLLERS if cgroups.available() for d in cgroups.base(c).iterdir() if d.name.startswith(f"{os.getpid()}-")]
    mounts = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if f" {root}/" in line]
    entries = sorted(set(os.listdir(root)) - {".owner"})
    return {"groups": groups, "mounts": mounts, "entries": entries}


@ROOT_ONLY
@pytest.mark.parametrize("name", one_fast(sorted(HOSTILE), fast=("daemon_in_a_new_session_ignoring_signals", "exit_1", "process_limit_filled")))
def test_no_process_of_a_calls_uid_outlives_the_call(name: str) -> None:
    """Whatever the program did, its uid has no process left, not even a zombie, when the call
    returns; the next call (a passing one) is not refused and leaves nothing either."""
    command, status = HOSTILE[name]
    workspace = Workspace(LIMITS)
    try:
        first = run_loop(workspace.terminal(command))
        assert status in first, first
        assert _left(workspace.lease.uid) == [], (name, first)
        second = run_loop(workspace.terminal("true"))
        assert second == "[exit code 0]", second
        assert _left(workspace.lease.uid) == []
    finally:
        run_loop(workspace.close())


@ROOT_ONLY
@pytest.mark.slow
def test_a_thousand_alternating_failing_and_passing_calls_all_answer_and_leave_nothing() -> None:
    """1,000 calls in one workspace, `exit 1` and `true` in turn: every one answers with its exit
    code, none leaves a process of the uid, and a failing call takes about what a passing one does
    (it used to wait ~2 s for the machine's pid 1 to reap the jail's init)."""
    workspace = Workspace(sandbox_limits(max_processes=16))
    took: dict[str, list[float]] = {"exit 1": [], "true": []}
    try:
        for i in range(1000):
            command = ("exit 1", "true")[i % 2]
            started = time.perf_counter()
            answer = run_loop(workspace.terminal(command))
            took[command].append(time.perf_counter() - started)
            assert answer == ("[exit code 1]" if command == "exit 1" else "[exit code 0]"), (i, answer)
            assert _left(workspace.lease.uid) == [], i
    finally:
        run_loop(workspace.close())
    failing, passing = statistics.median(took["exit 1"]), statistics.median(took["true"])
    assert failing < 2 * passing, (failing, passing)
    assert _leftovers() == {"groups": [], "mounts": [], "entries": []}


@ROOT_ONLY
@pytest.mark.slow
def test_fifty_workspaces_opened_and_closed_leave_nothing(own_leases: tuple[Path, int]) -> None:
    """50 workspaces, eight at a time, each with a failing and a passing call: none is refused, no
    process of their uids outlives a call, and closed they leave no control group, mount,
    directory or lease file."""
    directory, base = own_leases
    limits = sandbox_limits(max_processes=16, uid_base=base)
    uids: set[int] = set()

    async def one() -> None:
        workspace = Workspace(limits)
        try:
            uids.add(workspace.lease.uid)
            assert await workspace.terminal("ls missing-file") == "ls: cannot access 'missing-file': No such file or directory\n[exit code 2]"
            assert await workspace.terminal("echo ok") == "ok\n[exit code 0]"
            assert _left(workspace.lease.uid) == []
        finally:
            await workspace.close()

    async def all_of_them() -> None:
        slots = asyncio.Semaphore(8)

        async def limited() -> None:
            async with slots:
                await one()

        await asyncio.gather(*(limited() for _ in range(50)))

    run_loop(all_of_them())
    assert len(uids) > 8  # the leases were taken and given back, not one per workspace forever
    assert all(_left(uid) == [] for uid in uids)
    assert os.listdir(directory) == []
    assert _leftovers() == {"groups": [], "mounts": [], "entries": []}


@ROOT_ONLY
@pytest.mark.slow
def test_without_a_pid_namespace_of_its_own_a_call_waits_for_its_uids_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A root launcher that may not make PID namespaces (no CAP_SYS_ADMIN) runs the jail without
    one and waits, after every call, until its uid's processes are gone (slow where the machine's
    pid 1 reaps late, ~2 s here): nothing accumulates either."""
    monkeypatch.setattr("opd.jail.command.reaped_namespaces", lambda: False)
    workspace = Workspace(LIMITS)
    try:
        for command, status in (("exit 1", "[exit code 1]"), ("true", "[exit code 0]"), ("(setsid sleep 8765 &) ; exit 2", "[exit code 2]")):
            assert run_loop(workspace.terminal(command)) == status
            assert _left(workspace.lease.uid) == [], command
    finally:
        run_loop(workspace.close())


def test_a_jails_namespace_is_killed_through_a_pidfd_never_a_pid_read_earlier(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first process of a running jail's namespace is found in /proc by its parent (the jail's
    leader); the pid it was read under may be taken by another process before it is signalled
    (pids wrap around): a pidfd is opened first and the parent checked after, so a process that
    took the pid meanwhile is never signalled (the leader's group is killed instead)."""
    import signal
    import subprocess

    leader = subprocess.Popen(["sh", "-c", "sleep 30 & wait"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while (child := reaping._child_of(leader.pid)) is None:  # the shell has forked its child
            assert time.monotonic() < deadline
            time.sleep(0.01)
        os.close(child)
        real_parent_of = reaping._parent_of
        checks: list[int] = []

        def parent_of(pid: int) -> int | None:
            """The child's parent as the scan reads it, then another's: its pid changed hands."""
            parent = real_parent_of(pid)
            if parent == leader.pid:
                checks.append(pid)
                return parent if len(checks) % 2 else os.getpid()
            return parent

        monkeypatch.setattr(reaping, "_parent_of", parent_of)
        sent: list[int] = []
        monkeypatch.setattr(signal, "pidfd_send_signal", lambda fd, sig, *a: sent.append(sig))
        assert reaping._kill(Jail(leader, None, reaps_all=True)) is False  # no child of its own: the group instead
        assert len(checks) == 2 and sent == []
        assert leader.wait(10) == -signal.SIGKILL
    finally:
        leader.kill()
        leader.wait()
