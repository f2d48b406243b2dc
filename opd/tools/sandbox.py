"""Run untrusted Python in a limited subprocess.

What it guarantees: each run gets a fresh temporary directory as its working directory and HOME,
a scrubbed environment (no variables of the parent), the interpreter in isolated mode, resource
limits set before `exec` (CPU seconds, address space, file size, open files, and processes where
the kernel enforces them), a wall-clock timeout after which its whole process group is killed,
stdout/stderr captured to files and truncated, and a new network namespace where the kernel lets
an unprivileged or root process create one (then no network at all). It is not a container: the
code can read world-readable files outside its directory and use CPU until its limit.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import resource
import shutil
import signal
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass

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
class SandboxLimits:
    """Resource limits for one sandboxed run."""

    # Wall-clock seconds before the process group is killed.
    timeout_s: float = 10.0
    # CPU seconds (RLIMIT_CPU).
    cpu_s: int = 10
    # Address-space limit in MiB (RLIMIT_AS).
    memory_mb: int = 1024
    # Largest file the code may write, in MiB (RLIMIT_FSIZE); also caps captured output.
    file_size_mb: int = 16
    # Most processes for the sandbox user (RLIMIT_NPROC; not enforced for root by Linux).
    max_processes: int = 64
    # Most open file descriptors (RLIMIT_NOFILE).
    max_open_files: int = 64
    # Characters of stdout and of stderr returned to the model.
    output_chars: int = 2000
    # Put the child in a new network namespace (no network) where the kernel allows it.
    isolate_network: bool = True


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


def _preexec(limits: SandboxLimits) -> None:
    """Runs in the child between fork and exec: apply limits, detach, drop the network."""
    os.setsid()
    mib = 1024 * 1024
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_mb * mib, limits.memory_mb * mib))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_size_mb * mib, limits.file_size_mb * mib))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.max_open_files, limits.max_open_files))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_processes, limits.max_processes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if limits.isolate_network:
        ctypes.CDLL(None, use_errno=True).unshare(_CLONE_NEWNET)


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


async def run_command(argv: list[str], workdir: str, limits: SandboxLimits) -> SandboxResult:
    """Run `argv` in `workdir` under `limits`; output is captured to files there, then removed.

    Never raises for anything the command does; every process it started is killed when this
    returns.
    """
    started = time.monotonic()
    out_path, err_path = os.path.join(workdir, ".stdout"), os.path.join(workdir, ".stderr")
    # The project's interpreter first, so `python` in a command means the one running us.
    env = {"PATH": f"{os.path.dirname(sys.executable)}:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8",
           # A rewrite within the same second and of the same size would otherwise run stale bytecode.
           "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = await asyncio.create_subprocess_exec(
                *argv, cwd=workdir, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=err,
                preexec_fn=lambda: _preexec(limits), close_fds=True,
            )
        timed_out = False
        try:
            await asyncio.wait_for(proc.wait(), timeout=limits.timeout_s)
        except asyncio.TimeoutError:
            timed_out = True
        finally:
            # Kill the whole group: the child and anything it left running in the background.
            _kill_group(proc.pid)
            if proc.returncode is None:
                await proc.wait()
        stdout = _read_truncated(out_path, limits.output_chars)
        stderr = _read_truncated(err_path, limits.output_chars)
    finally:
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


async def run_python(code: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Run `code` in a fresh sandbox directory (removed afterwards); see `run_command`."""
    workdir = tempfile.mkdtemp(prefix="opd-sandbox-")
    try:
        snippet = os.path.join(workdir, "snippet.py")
        with open(snippet, "w", encoding="utf-8") as handle:
            handle.write(code)
        return await run_command([sys.executable, "-I", "-c", _RUNNER, snippet], workdir, limits)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
