"""Run untrusted code in a jail: each call in its own namespaces, directory, uid and control group,
many calls at once (a run's rollouts make them concurrently).

A call, in the order it happens (one module per step):
- a uid of its own when the launcher runs as root (`opd.jail.uids`);
- a directory of its own, and as root a capped tmpfs for it and its /tmp and /dev/shm
  (`opd.jail.call_dirs`; `opd.jail.tmpfs`): a write past the cap fails as it happens (ENOSPC),
  and the result says which place is full;
- the jail itself: bubblewrap under `prlimit` and `setpriv`, in a control group where the launcher
  may create one (`opd.jail.command`; `opd.jail.cgroups`);
- the call ends as soon as its processes are gone, whatever its exit status (as root, the jail's
  leader exits only once every process of the call has been reaped); at a wall-clock timeout the
  jail is killed and reaped, and with it every process inside (`opd.jail.reaping`);
- its output captured to files outside the jail, cut to `output_chars`, and in words which limit
  stopped it (CPU seconds, memory, file size, wall clock, a signal) (`opd.jail.capture`).

A missing or unusable bwrap is an error that names the fix (there is no weaker fallback: the
`unshare` backend, which had no mount namespace, was removed).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import textwrap
import time
from dataclasses import dataclass, replace
from pathlib import Path

from opd.config import SandboxConfig
from opd.jail import tmpfs
from opd.jail.call_dirs import CallDirs, jail_dirs, launcher_dirs
from opd.jail.capture import read_cut, stopped_by
from opd.jail.command import CallArea, interpreter, spawn
from opd.jail.reaping import exited, stop
from opd.jail.uids import UidLease

# Executed by the child: runs the snippet and prints the value of a trailing expression, as a REPL
# would, so `x = 2\nx * 3` shows 6.
_RUNNER = textwrap.dedent(
    """
    import ast, sys
    source = open(sys.argv[1], encoding="utf-8").read()
    tree = ast.parse(source, "<snippet>")
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    scope = {"__name__": "__main__"}
    exec(compile(tree, "<snippet>", "exec"), scope)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), "<snippet>", "eval"), scope)
        if value is not None:
            print(repr(value))
    """
)


@dataclass(frozen=True)
class SandboxResult:
    """What a jailed call produced; `error` is None only for a clean exit with code 0 that filled
    none of its quotas."""

    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool
    error: str | None
    wall_s: float

    def as_tool_result(self) -> dict[str, object]:
        result: dict[str, object] = {"stdout": self.stdout, "stderr": self.stderr, "exit_code": self.exit_code}
        if self.error:
            result["error"] = self.error
        return result


async def run_jailed(argv: list[str], area: CallArea, limits: SandboxConfig, uid: int | None, dirs: CallDirs | None = None) -> SandboxResult:
    """Run `argv` jailed in `area` as `uid` under `limits`, its output captured (in `dirs`, the
    launcher's by default). Never raises for anything the command does; every process it started
    has exited when this returns."""
    started = time.monotonic()
    capture = (dirs or launcher_dirs()).scratch("capture-")
    try:
        with open(capture / "out", "wb") as out, open(capture / "err", "wb") as err:
            jail = spawn(argv, area, limits, uid, out, err)
        timed_out = False
        try:
            await asyncio.wait_for(exited(jail.proc), timeout=limits.timeout_s)
        except asyncio.TimeoutError:
            timed_out = True
        finally:
            code = await stop(jail, uid)  # every process of the call is gone when it returns
        stdout = read_cut(capture / "out", limits.output_chars)
        stderr = read_cut(capture / "err", limits.output_chars)
    finally:
        shutil.rmtree(capture, ignore_errors=True)
    return SandboxResult(stdout, stderr, None if timed_out else code, timed_out, stopped_by(code, timed_out, stderr, limits), time.monotonic() - started)


def _noting_full(result: SandboxResult, root: Path, limits: SandboxConfig, what: str, dirs: CallDirs) -> SandboxResult:
    """`result` with `<what> full (...)` added to its error when the call's tmpfs at `root` is full."""
    words = tmpfs.full_words(root, tmpfs.Quota(limits.tmp_mb, limits.tmp_files), what) if dirs.is_tmpfs(root) else None
    return result if words is None else replace(result, error=f"{result.error or 'exited with code 0'}; {words}")


async def run_command(argv: list[str], workdir: Path, limits: SandboxConfig, uid: int | None, dirs: CallDirs | None = None) -> SandboxResult:
    """Run `argv` jailed in `workdir` (a workspace) as `uid` under `limits` (`run_jailed`); its
    /tmp and /dev/shm are a tmpfs of the call's own (in `dirs`, the launcher's by default) where
    the launcher may mount one."""
    dirs = dirs or launcher_dirs()
    if not tmpfs.available():
        return await run_jailed(argv, CallArea(workdir), limits, uid, dirs)
    root = dirs.make("tmp-", uid, tmpfs.Quota(limits.tmp_mb, limits.tmp_files))
    try:
        jail_dirs(root, ("tmp", "shm"), uid)
        result = await run_jailed(argv, CallArea(workdir, root), limits, uid, dirs)
        return _noting_full(result, root, limits, "its /tmp and /dev/shm are", dirs)
    finally:
        await dirs.remove(root)


async def run_python(code: str, limits: SandboxConfig, dirs: CallDirs | None = None) -> SandboxResult:
    """Run `code` jailed in a fresh directory (in `dirs`, the launcher's by default) with a uid of
    its own (both gone afterwards)."""
    dirs = dirs or launcher_dirs()
    lease = UidLease.take(limits.uid_base)
    try:
        root, area = dirs.area("python-", lease.uid, limits)
    except BaseException:
        lease.release()
        raise
    try:
        snippet = area.work / "snippet.py"
        fd = os.open(snippet, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(code)
        result = await run_jailed([interpreter()[0], "-I", "-c", _RUNNER, str(snippet)], area, limits, lease.uid, dirs)
        return _noting_full(result, root, limits, "its directory, /tmp and /dev/shm are", dirs)
    finally:
        try:
            await dirs.remove(root)
        finally:
            lease.release()
