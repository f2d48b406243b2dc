"""Run untrusted Python in a limited subprocess.

What it guarantees: each run gets a fresh temporary directory as its working directory and HOME,
a scrubbed environment (no variables of the parent), the interpreter in isolated mode, resource
limits set before `exec` (CPU seconds, address space, file size, open files), a process-count
limit (a pids cgroup where one can be created, else RLIMIT_NPROC, which Linux does not apply to
root), a wall-clock timeout after which every process it started is killed, stdout/stderr
captured to files and truncated, a new PID namespace (it cannot see or signal the processes
outside: not the launcher, not other rollouts) and a new network namespace (no network) where the
kernel allows them. It is not a container: the code can read world-readable files outside its
directory and use CPU until its limit.

Where `sh`, `prlimit` and `unshare` are available the child is started by vfork and the limits are
applied by that exec chain (`_exec_chain`), so a call never blocks the event loop on a fork of
the launcher; elsewhere the same limits are applied by Python code between fork and exec.
"""

from __future__ import annotations

import asyncio
import atexit
import ctypes
import logging
import os
import pwd
import resource
import shutil
import signal
import sys
import tempfile
import subprocess
import textwrap
import time
import uuid
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from opd.config import SandboxConfig

logger = logging.getLogger(__name__)

_CLONE_NEWNET = 0x40000000

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
    """What a sandboxed run produced; `error` is None only for a clean exit with code 0."""

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


@lru_cache(maxsize=1)
def _unshare() -> str | None:
    """The unshare binary, if it can create a PID namespace here (root, or user namespaces)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    try:
        ok = subprocess.run([unshare, "--pid", "--fork", "--kill-child", "--", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    if not ok:
        logger.warning("no PID namespaces here: sandboxed code can see and signal other processes of its user")
    return unshare if ok else None


def _drop_privileges(ids: tuple[int, int]) -> None:
    """In a child before exec: become the sandbox user, with no supplementary groups."""
    os.setgroups([])
    os.setgid(ids[1])
    os.setuid(ids[0])


def _runs_as(ids: tuple[int, int], python: str) -> bool:
    """Can the sandbox user start this interpreter (every directory above it must let it in)?"""
    try:
        return subprocess.run([python, "-I", "-c", "pass"], preexec_fn=lambda: _drop_privileges(ids), capture_output=True, timeout=30, cwd="/").returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@lru_cache(maxsize=8)
def sandbox_plan(user: str) -> tuple[tuple[int, int] | None, str]:
    """((uid, gid) to drop to or None, the interpreter sandboxed code runs).

    Only root drops privileges. The project's interpreter is used when the sandbox user can run
    it; a virtualenv under /root cannot be, so the system's python3 is used then.
    """
    if os.geteuid() != 0 or not user:
        return None, sys.executable
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        logger.warning("sandbox user %r does not exist: sandboxed code runs as root", user)
        return None, sys.executable
    ids = (entry.pw_uid, entry.pw_gid)
    for python in (sys.executable, shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")):
        if python and _runs_as(ids, python):
            if python != sys.executable:
                logger.info("sandboxed code runs %s as %s (%s is not reachable by that user)", python, user, sys.executable)
            return ids, python
    logger.warning("user %r cannot run any python here: sandboxed code runs as root", user)
    return None, sys.executable


@lru_cache(maxsize=8)
def _bin_dir(python: str) -> str:
    """A directory with `python` and `python3` pointing at the sandbox's interpreter (first on PATH)."""
    if os.path.basename(python) == "python" and python == sys.executable:
        return os.path.dirname(python)
    path = tempfile.mkdtemp(prefix="opd-sandbox-bin-")
    os.chmod(path, 0o755)
    for name in ("python", "python3"):
        os.symlink(python, os.path.join(path, name))
    atexit.register(shutil.rmtree, path, True)
    return path


def _give_to(workdir: str, ids: tuple[int, int]) -> None:
    """Make the run's directory tree the sandbox user's (files our own tools wrote included)."""
    uid, gid = ids
    os.lchown(workdir, uid, gid)
    for root, dirs, files in os.walk(workdir):
        for name in dirs + files:
            os.lchown(os.path.join(root, name), uid, gid)


@lru_cache(maxsize=1)
def _launchers() -> tuple[str, str] | None:
    """(sh, prlimit) when the limits can be applied by an exec chain instead of Python code run
    between fork and exec (needs unshare too). Without a `preexec_fn`, CPython starts the child
    with vfork: ~1 ms instead of a fork that copies the launcher's page tables (~40 ms at 500 MiB
    RSS, during which the event loop, and so every other rollout, waits)."""
    sh, prlimit = shutil.which("sh"), shutil.which("prlimit")
    if sh is None or prlimit is None or _unshare() is None:
        return None
    return sh, prlimit


@lru_cache(maxsize=1)
def _net_namespace_ok() -> bool:
    """Can unshare also create a network namespace here?"""
    unshare = _unshare()
    if unshare is None:
        return False
    try:
        ok = subprocess.run([unshare, "--pid", "--fork", "--kill-child", "--net", "--", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    if not ok:
        logger.warning("no network namespaces here: sandboxed code keeps the network (isolate_network cannot apply)")
    return ok


def _exec_chain(argv: list[str], limits: SandboxConfig, cgroup: "_PidsCgroup", ids: tuple[int, int] | None) -> list[str]:
    """argv behind the programs that apply what `_preexec` does, each exec'ing the next:
    sh (joins the pids cgroup, before anything can fork), prlimit (resource limits), unshare
    (`_command`: PID and network namespaces, then drops to the sandbox user)."""
    launchers = _launchers()
    assert launchers is not None
    sh, prlimit = launchers
    mib = 1024 * 1024
    chain: list[str] = []
    if cgroup.path is not None:
        chain += [sh, "-c", 'echo 0 > "$0" && exec "$@"', str(cgroup.path / "cgroup.procs")]
    chain += [prlimit, f"--cpu={limits.cpu_s}:{limits.cpu_s + 1}", f"--as={limits.memory_mb * mib}", f"--fsize={limits.file_size_mb * mib}",
              f"--nofile={limits.max_open_files}", "--core=0"]
    if cgroup.path is None:  # per user, so shared by concurrent runs: the cgroup is per run
        chain.append(f"--nproc={limits.max_processes}")
    return [*chain, "--", *_command(argv, ids, net=limits.isolate_network and _net_namespace_ok())]


def _command(argv: list[str], ids: tuple[int, int] | None, net: bool = False) -> list[str]:
    """argv inside a new PID namespace (and network namespace if `net`), as the sandbox user,
    where unshare works here."""
    unshare = _unshare()
    if unshare is None:
        return list(argv)
    drop = ["--setuid", str(ids[0]), "--setgid", str(ids[1])] if ids else []
    return [unshare, "--pid", "--fork", "--kill-child", *(["--net"] if net else []), *drop, "--", *argv]


@lru_cache(maxsize=1)
def _pids_cgroup_root() -> Path | None:
    """A writable pids-controller hierarchy (cgroup v1 or v2), or None."""
    for root in (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup")):
        if (root / "cgroup.procs").exists() and os.access(root, os.W_OK):
            probe = root / f"opd-probe-{uuid.uuid4().hex[:8]}"
            try:
                probe.mkdir()
            except OSError:
                continue
            try:
                if (probe / "pids.max").exists():
                    return root
            finally:
                probe.rmdir()
    logger.info("no writable pids cgroup: the sandbox's process limit is RLIMIT_NPROC only (not enforced for root)")
    return None


_stale_cgroups: set[Path] = set()


def remove_stale_cgroups() -> None:
    """Remove cgroups whose last process had not been reaped yet when their run ended."""
    for path in list(_stale_cgroups):
        try:
            path.rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            continue
        _stale_cgroups.discard(path)


atexit.register(remove_stale_cgroups)


class _PidsCgroup:
    """A cgroup that caps the number of processes of one sandboxed run and kills them all at the end."""

    def __init__(self, max_processes: int) -> None:
        remove_stale_cgroups()
        root = _pids_cgroup_root()
        self.path: Path | None = None
        if root is not None:
            path = root / f"opd-sandbox-{uuid.uuid4().hex}"
            try:
                path.mkdir()
                (path / "pids.max").write_text(str(max_processes))
                self.path = path
            except OSError as err:
                logger.warning("could not set up a pids cgroup (%s); RLIMIT_NPROC only", err)

    def join(self) -> None:
        """In the child before exec: move this process (and so all it starts) into the cgroup."""
        if self.path is not None:
            with open(self.path / "cgroup.procs", "w") as handle:
                handle.write("0")

    def close(self) -> None:
        """Kill whatever is left in the cgroup, then remove it."""
        if self.path is None:
            return
        for _ in range(50):
            try:
                pids = [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
            except OSError:
                break
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)
        for _ in range(10):
            try:
                self.path.rmdir()
                self.path = None
                return
            except OSError:
                time.sleep(0.02)
        # A killed process not reaped yet (e.g. the call was cancelled) keeps the cgroup busy.
        _stale_cgroups.add(self.path)
        self.path = None


def _preexec(limits: SandboxConfig, cgroup: _PidsCgroup, ids: tuple[int, int] | None) -> None:
    """Runs in the child between fork and exec: apply limits, detach, drop the network, and
    (without unshare, which otherwise does it inside the new namespace) drop root."""
    os.setsid()
    cgroup.join()
    mib = 1024 * 1024
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_mb * mib, limits.memory_mb * mib))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_size_mb * mib, limits.file_size_mb * mib))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.max_open_files, limits.max_open_files))
    if cgroup.path is None:  # per user, so shared by concurrent runs: the cgroup is per run
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_processes, limits.max_processes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if limits.isolate_network:
        ctypes.CDLL(None, use_errno=True).unshare(_CLONE_NEWNET)
    if ids is not None and _unshare() is None:
        _drop_privileges(ids)


def _read_truncated(path: str, limit: int) -> str:
    with open(path, "rb") as handle:
        data = handle.read(limit * 4 + 1)
    text = data.decode("utf-8", errors="replace")
    if len(text) > limit or len(data) > limit * 4:
        return text[:limit] + f"\n...[truncated at {limit} characters]"
    return text


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


async def _exited(proc: subprocess.Popen) -> int:
    """Wait for a child without blocking the event loop: a pidfd becomes readable when it exits
    (Linux >= 5.3); elsewhere a worker thread waits."""
    if proc.poll() is not None:
        return proc.returncode
    loop = asyncio.get_running_loop()
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        return await loop.run_in_executor(None, proc.wait)
    exited: asyncio.Future[None] = loop.create_future()
    loop.add_reader(fd, lambda: exited.done() or exited.set_result(None))
    try:
        await exited
    finally:
        loop.remove_reader(fd)
        os.close(fd)
    return proc.wait()


async def run_command(argv: list[str], workdir: str, limits: SandboxConfig) -> SandboxResult:
    """Run `argv` in `workdir` under `limits`; output is captured to files there, then removed.

    Never raises for anything the command does; every process it started is killed when this
    returns.
    """
    started = time.monotonic()
    out_path, err_path = os.path.join(workdir, ".stdout"), os.path.join(workdir, ".stderr")
    ids, python = sandbox_plan(limits.user)
    # The sandbox's interpreter first, so `python` in a command means that one.
    env = {"PATH": f"{_bin_dir(python)}:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8",
           # A rewrite within the same second and of the same size would otherwise run stale bytecode.
           "PYTHONDONTWRITEBYTECODE": "1"}
    cgroup = _PidsCgroup(limits.max_processes)
    try:
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            if ids is not None:
                _give_to(workdir, ids)
            if _launchers() is not None:
                # No preexec_fn: CPython starts the child by vfork, ~1 ms. (Any fork, the event
                # loop's spawn included, blocks the loop ~30 ms per call at 500 MiB RSS.)
                command, start = _exec_chain(argv, limits, cgroup, ids), {"start_new_session": True}
            else:
                command, start = _command(argv, ids), {"preexec_fn": lambda: _preexec(limits, cgroup, ids)}
            proc = subprocess.Popen(command, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err, close_fds=True, **start)
        timed_out = False
        try:
            await asyncio.wait_for(_exited(proc), timeout=limits.timeout_s)
        except asyncio.TimeoutError:
            timed_out = True
        finally:
            # Kill the whole group: the child and anything it left running in the background
            # (the PID namespace and the cgroup also catch processes that left the group).
            _kill_group(proc.pid)
            if proc.returncode is None:
                await _exited(proc)
            cgroup.close()
        stdout = _read_truncated(out_path, limits.output_chars)
        stderr = _read_truncated(err_path, limits.output_chars)
    finally:
        cgroup.close()
        for path in (out_path, err_path):
            try:
                os.unlink(path)
            except OSError:
                pass
    code = proc.returncode
    if timed_out:
        error = f"timed out after {limits.timeout_s:g} s"
    elif code is not None and code < 0:
        error = f"killed by signal {signal.Signals(-code).name} (a resource limit was hit)"
    elif code != 0:
        error = f"exited with code {code}"
    else:
        error = None
    return SandboxResult(stdout, stderr, None if timed_out else code, timed_out, error, time.monotonic() - started)


async def run_python(code: str, limits: SandboxConfig) -> SandboxResult:
    """Run `code` in a fresh sandbox directory (removed afterwards); see `run_command`."""
    workdir = tempfile.mkdtemp(prefix="opd-sandbox-")
    try:
        snippet = os.path.join(workdir, "snippet.py")
        with open(snippet, "w", encoding="utf-8") as handle:
            handle.write(code)
        return await run_command([sandbox_plan(limits.user)[1], "-I", "-c", _RUNNER, snippet], workdir, limits)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
