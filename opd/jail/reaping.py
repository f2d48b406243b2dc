"""Ending a jail: a running one killed while its leader is an unreaped child (nothing else can hold
its pid or group then), the leader reaped, the control group removed. Only `stop` reaps a jail's
leader. With a root launcher the leader exits only once every process of the call has been reaped
(`opd.jail.command._reaped_namespace`): a call ends as soon as its processes are gone, and nothing
is polled. Elsewhere the uid's processes are waited for (`wait_until_gone`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time

from opd.jail.command import Jail


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
    """Kill a jail if it still runs (`_kill`), reap its leader and return its exit status, then
    remove its control group. With `reaps_all` (a root launcher: `opd.jail.command._reaped_namespace`)
    the leader has exited only once every process of the call has been reaped, so nothing is
    waited for beyond it. Otherwise, with `uid`, also wait (up to 5 s) until no process of that uid
    runs (`wait_until_gone`): the uid's next call counts them against its process limit."""
    proc = jail.proc
    whole_call_reaped = jail.reaps_all
    if proc.returncode is None:
        if not _has_exited(proc.pid):
            whole_call_reaped = await asyncio.to_thread(_kill, jail) and whole_call_reaped
        await exited(proc)
        proc.wait()  # it has exited: returns at once
    if uid is not None and not whole_call_reaped:
        await wait_until_gone(uid)
    if jail.group is not None:
        group, jail.group = jail.group, None
        await asyncio.to_thread(group.remove)
    return proc.returncode


def _has_exited(pid: int) -> bool:
    """Has child `pid` exited (it stays unreaped)?"""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _kill(jail: Jail) -> bool:
    """SIGKILL a running jail, its leader still unreaped (nothing else can hold its pid or group).
    With `reaps_all`: only the leader's child, the first process of the call's PID namespace; its
    end kills the namespace and the leader, alive, reaps it and exits (True). Killing the leader
    too would orphan that process to the machine's pid 1. When the leader has no child (not forked
    yet, or already reaped) or the jail has no namespace: the leader's process group, which also
    ends the chain before the jail exists (False: a child forked meanwhile may be left to pid 1)."""
    if jail.reaps_all:
        child = _child_of(jail.proc.pid)
        if child is not None:
            try:
                signal.pidfd_send_signal(child, signal.SIGKILL)
            except ProcessLookupError:  # exited meanwhile: the leader reaps it all the same
                pass
            finally:
                os.close(child)
            return True
    with contextlib.suppress(ProcessLookupError):
        os.killpg(jail.proc.pid, signal.SIGKILL)
    return False


def _child_of(parent: int) -> int | None:
    """A pidfd of the one child of `parent`, an unreaped child of ours that forks once (`unshare`),
    or None when it has none. A pid read from /proc may be reused before it is signalled (the
    machine's pids wrap around): the pidfd is opened first and the process behind the pid checked
    after, so a pid taken meanwhile by any other process is never signalled."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and _parent_of(int(entry.name)) == parent:
            pid = int(entry.name)
            try:
                fd = os.pidfd_open(pid)
            except OSError:  # exited and reaped meanwhile
                return None
            if _parent_of(pid) == parent:  # the same process: `parent` forks no other and its pid is held
                return fd
            os.close(fd)
            return None
    return None


def _parent_of(pid: int) -> int | None:
    """The parent pid of `pid` (None when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    return int(stat[stat.rindex(b")") + 2:].split()[1])


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
