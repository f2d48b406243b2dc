"""Ending a jail and waiting for what it left: its process group killed while its leader is an
unreaped child (nothing else can hold its pid or group then), the leader reaped, the uid's
processes waited for, the control group removed. Only `stop` reaps a jail's leader.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time

from opd.tools.jail import Jail


async def exited(proc: subprocess.Popen) -> None:
    """Wait, without blocking the event loop, until a child has exited, leaving it unreaped: while
    it is an unreaped child its pid, and so its process group, cannot be taken by another process
    (`stop` kills the group, then reaps). A pidfd becomes readable when the child exits."""
    if proc.returncode is not None:
        return
    loop = asyncio.get_running_loop()
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        await loop.run_in_executor(None, _wait_unreaped, proc.pid)
        return
    done: asyncio.Future[None] = loop.create_future()
    loop.add_reader(fd, lambda: done.done() or done.set_result(None))
    try:
        await done
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def _wait_unreaped(pid: int) -> None:
    """Block until child `pid` has exited, without reaping it."""
    with contextlib.suppress(ChildProcessError):
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)


async def stop(jail: Jail, uid: int | None = None) -> int:
    """Kill a jail, reap it and return its exit status: its processes die with it (PID namespace,
    die-with-parent); the group kill also ends the chain before the jail exists. With `uid`, also
    wait (up to 5 s) until no process of that uid runs: the uid's next call counts them against
    its process limit, and a fork bomb's thousand children take a moment to go. Then the jail's
    control group is removed."""
    proc = jail.proc
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await exited(proc)
        proc.wait()  # it has exited: returns at once
    if uid is not None:
        await wait_until_gone(uid)
    if jail.group is not None:
        group, jail.group = jail.group, None
        await asyncio.to_thread(group.remove)
    return proc.returncode


async def wait_until_gone(uid: int, timeout_s: float = 5.0) -> None:
    """Wait (up to `timeout_s`) until no process of `uid` is left, zombies included: a zombie still
    holds one of the uid's RLIMIT_NPROC slots until it is reaped (for the jail's orphaned init,
    by the machine's pid 1, which may reap late), and a leader whose main thread exited shows as a
    zombie while its other threads run. A persistent workspace's uid would otherwise gather one
    zombie per call and hit its process limit."""
    await asyncio.to_thread(_wait_until_gone, uid, timeout_s)


def processes_of(uid: int) -> list[int]:
    """The pids of every process of `uid`, zombies included."""
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):  # gone meanwhile
                if entry.stat(follow_symlinks=False).st_uid == uid:
                    pids.append(int(entry.name))
    return pids


def _wait_until_gone(uid: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while processes_of(uid) and time.monotonic() < deadline:
        time.sleep(0.02)
