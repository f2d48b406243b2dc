"""Run untrusted code in a jail: bubblewrap (`bwrap`), each call alone (calls run at once, each
in its own namespaces, directories, uid and control group).

Per call (`env.sandbox.backend: bwrap`):
- its own mount namespace: the interpreter and the system's libraries read-only, the call's own
  directory, a private `/tmp` and `/dev/shm` (RAM-backed, gone with the call) the only writable
  places (the rest of the jail, bwrap's own tmpfs under `/`, is read-only), its own `/proc` (a new PID namespace: it sees only its own processes), no network
  (a new network namespace), no new user namespaces, a new session, and it dies with its parent;
- as root, every place it can write is a tmpfs capped in bytes and in files (`opd.tools.tmpfs`):
  the workspace (`workspace_mb`, `workspace_files`), and per call its /tmp and /dev/shm together,
  with a python call's or the reward's directory (`tmp_mb`, `tmp_files`); a write past the cap
  fails as it happens (ENOSPC), and the result says which place is full;
- when the launcher runs as root, a uid of its own (`uid_base` onwards, leased per workspace or
  per python call, never shared by two at once, also across launchers on one machine), so even a
  bind that leaked would not let one rollout read or write another's files or signal its
  processes, and the process limit (RLIMIT_NPROC, counted per uid) is the call's own;
- resource limits set before anything runs (`prlimit`): CPU seconds, address space, file size,
  open files, processes, no core dumps; where the launcher may create control groups, a memory and
  a process limit for all the call's processes together (`opd.tools.cgroups`); a wall-clock
  timeout after which the jail is killed, and with it every process inside;
- output captured to files outside the jail and cut to `output_chars`; the error says in words
  which limit stopped the call (CPU seconds, memory, file size, wall clock, a signal).

A missing or unusable bwrap is an error that names the fix (there is no weaker fallback: the
`unshare` backend, which had no mount namespace, was removed).

The launcher creates the call directories itself; as root each is a tmpfs, counted by statvfs and
removed by one unmount on a thread, else it measures and removes them with coreutils `du` and `rm`
off the event loop (any depth and path length); nothing it does follows a path the jailed code
could have changed (see `opd.tools.workspace` for the file tools). What a call prints is captured
to files outside the jail, each bounded by the call's file-size limit.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import fcntl
import logging
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from opd.config import SandboxConfig
from opd.tools import cgroups, tmpfs

logger = logging.getLogger(__name__)

MIB = 1024 * 1024
# Inside a bwrap jail: where `python` and `python3` link to the jail's interpreter.
BIN_DIR = "/opd/bin"
# Leased uids: this many above uid_base.
UID_COUNT = 60_000

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


class SandboxUnavailable(RuntimeError):
    """The configured backend cannot run here; the message says why and what to do."""


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


# ---- uids ----------------------------------------------------------------------------------


# Where a root launcher locks its uid leases: the first of these that is a system directory (owned
# by root, writable by others only when sticky). A fixed place, whatever TMPDIR says: launchers with
# different TMPDIRs, or with private /tmp directories (Slurm's job_container/tmpfs), share it.
# /run/lock is the FHS place for the machine's lock files (a tmpfs: emptied at boot, as the locks
# are); /tmp only where neither exists, with a warning.
LOCK_PARENTS = ("/run/lock", "/var/lock", "/tmp")
LOCK_DIR_NAME = "opd-uid-leases"


def _system_dir(path: str) -> bool:
    """Is `path` a directory that only root can rename entries in (root's, not writable by others,
    or sticky)?"""
    try:
        info = os.stat(path)
    except OSError:
        return False
    writable_by_others = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    return stat.S_ISDIR(info.st_mode) and info.st_uid == 0 and (not writable_by_others or bool(info.st_mode & stat.S_ISVTX))


@lru_cache(maxsize=1)
def _lock_dir() -> Path:
    """The machine's directory of uid leases (see LOCK_PARENTS): a directory, not a symlink, owned
    by this (root) launcher, mode 0700, so no jailed code can reach it; anything else found under
    its name is an error that says so."""
    parent = next((p for p in LOCK_PARENTS if _system_dir(p)), None)
    if parent is None:
        raise SandboxUnavailable(f"no directory for uid leases: none of {', '.join(LOCK_PARENTS)} is a root-owned directory")
    if parent == "/tmp":
        logger.warning("uid leases are locked in /tmp (no /run/lock or /var/lock): launchers with private /tmp directories may share uids")
    path = Path(parent) / LOCK_DIR_NAME
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        raise SandboxUnavailable(f"{path} must be a directory (not a symlink) for uid leases: {err.strerror}; remove it") from None
    try:
        owner = os.fstat(fd).st_uid
        if owner != os.geteuid():
            raise SandboxUnavailable(f"{path} belongs to uid {owner}, not to this launcher's uid {os.geteuid()}; remove it")
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    return path


class UidLease:
    """One uid for one workspace or call: held through an exclusive lock on a file per uid, so two
    leases never share a uid, in this process or any other on the machine (a process that dies
    releases its locks). None as `uid` means the launcher is not root: calls keep its uid."""

    def __init__(self, uid: int | None, fd: int | None) -> None:
        self.uid, self._fd = uid, fd

    @classmethod
    def take(cls, base: int) -> "UidLease":
        if os.geteuid() != 0:
            return cls(None, None)
        lock_dir = _lock_dir()
        start = random.randrange(UID_COUNT)
        for step in range(UID_COUNT):
            uid = base + (start + step) % UID_COUNT
            fd = os.open(lock_dir / str(uid), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return cls(uid, fd)
        raise SandboxUnavailable(f"all {UID_COUNT} sandbox uids from {base} are leased")

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# ---- call directories ----------------------------------------------------------------------


def _launcher_gone(directory: Path) -> bool:
    """Is the launcher that made `directory` (opd-sandbox-<pid>-...) gone: no process with that
    pid, and its lock on `.owner` free? A killed launcher cannot remove its directories."""
    try:
        pid = int(directory.name.split("-")[2])
        os.kill(pid, 0)
        return False
    except (IndexError, ValueError):
        return False
    except ProcessLookupError:
        pass
    except PermissionError:
        return False
    try:
        fd = os.open(directory / ".owner", os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


@lru_cache(maxsize=1)
def _calls_root() -> Path:
    """This launcher's directory of call directories (removed at exit); those of launchers that
    were killed are removed meanwhile by a thread (`sweeper`)."""
    base = Path(tempfile.gettempdir())
    stale = [path for path in base.glob("opd-sandbox-*") if path.is_dir() and not path.is_symlink() and _launcher_gone(path)]
    root = Path(tempfile.mkdtemp(prefix=f"opd-sandbox-{os.getpid()}-", dir=base))
    os.chmod(root, 0o711)  # leased uids may enter their own directory, not list the others
    fd = os.open(root / ".owner", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # held for the life of this process
    atexit.register(remove_now, root)
    if stale:
        global sweeper
        sweeper = threading.Thread(target=_sweep, args=(stale,), name="opd-sandbox-sweep", daemon=True)
        sweeper.start()
    return root


# The thread removing the directories of killed launchers (None until one was needed).
sweeper: threading.Thread | None = None


def _sweep(stale: list[Path]) -> None:
    """Remove killed launchers' directories, one after another; one that cannot be removed is
    logged and left."""
    for path in stale:
        remove_now(path)


# Call directories that are tmpfs mount points (`make_call_dir` with a quota, as root).
_MOUNTED: set[Path] = set()


def make_call_dir(prefix: str, uid: int | None, quota: tmpfs.Quota | None = None) -> Path:
    """A fresh directory for a workspace or a call, owned by `uid`, private to it; with `quota`,
    where the launcher may mount (`tmpfs.available`), a tmpfs of that size and number of files."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=_calls_root()))
    if quota is not None and tmpfs.available():
        try:
            tmpfs.mount(path, quota, uid)
        except OSError:
            os.rmdir(path)
            raise
        _MOUNTED.add(path)
        return path
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        if uid is not None:
            os.fchown(fd, uid, uid)
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    return path


def is_tmpfs(path: Path) -> bool:
    """Is `path` a call directory with a tmpfs (and so a quota the kernel holds) of its own?"""
    return path in _MOUNTED


@dataclass(frozen=True)
class CallArea:
    """Where one jailed call writes: `work` (its directory) and, when `tmpfs` is set, the /tmp and
    /dev/shm it binds from that tmpfs (`scratch`/tmp, `scratch`/shm; else bwrap's own of tmp_mb)."""

    work: Path
    scratch: Path | None = None


def call_area(prefix: str, uid: int | None, limits: SandboxConfig) -> tuple[Path, CallArea]:
    """A call directory of its own (a tmpfs of `tmp_mb` and `tmp_files` where possible) holding
    the call's directory and its /tmp and /dev/shm, all owned by `uid`: (the directory to remove
    afterwards, the area to run in)."""
    root = make_call_dir(prefix, uid, tmpfs.Quota(limits.tmp_mb, limits.tmp_files))
    if not is_tmpfs(root):
        return root, CallArea(root)
    try:
        _jail_dirs(root, ("work", "tmp", "shm"), uid)
    except BaseException:
        remove_now(root)
        raise
    return root, CallArea(root / "work", root)


def _jail_dirs(root: Path, names: tuple[str, ...], uid: int | None) -> None:
    """Make the directories `names` in a fresh call directory, owned by `uid`, private to it."""
    for name in names:
        os.mkdir(root / name, 0o700)
        if uid is not None:
            os.chown(root / name, uid, uid, follow_symlinks=False)


def scratch_dir(prefix: str) -> Path:
    """A fresh root-only directory (captured output, pipes' partners): no jailed code can reach it."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=_calls_root()))


# ---- measuring and removing call directories -------------------------------------------------
# Jailed code decides what its directory holds: chains thousands of directories deep, paths far
# longer than PATH_MAX, hundreds of thousands of files. coreutils `du` and `rm` walk any of these
# (gnulib's fts: iterative, through directory descriptors relative to their parent, never a full
# path), never follow a symlink (`du --no-dereference`; `rm` removes a link itself) and stay on the
# file system of the directory they were given (`--one-file-system`), so nothing outside it is
# read or touched. They run as processes of their own, awaited through a pidfd: the event loop
# goes on meanwhile. Nothing of the directory's jail runs while they do.


def _du(path: Path) -> list[str]:
    return [shutil.which("du") or "du", "--summarize", "--one-file-system", "--no-dereference", "--block-size=1", "--", str(path)]


def _rm(path: Path) -> list[str]:
    return [shutil.which("rm") or "rm", "--recursive", "--force", "--one-file-system", "--", str(path)]


async def _finished(argv: list[str]) -> tuple[int, str, str]:
    """Run `argv` to its end without blocking the event loop: (exit code, stdout, stderr's start)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, close_fds=True)
        await exited(proc)
        code = proc.wait()  # it has exited: reaps at once (rm and du are ours, no group to kill)
        out.seek(0)
        err.seek(0)
        return code, out.read(4096).decode(errors="replace"), err.read(2000).decode(errors="replace").strip()


def _removal_failed(path: Path, code: int, stderr: str) -> None:
    logger.error("could not remove %s (rm exited with %d): %s", path, code, stderr[:500] or "no message")


async def remove_call_dir(path: Path) -> None:
    """Remove a call directory, whatever it holds, without blocking the event loop. A failure is
    logged, never raised: the caller goes on (and frees its uid). A tmpfs is unmounted (at once,
    whatever it holds; its memory is freed on a thread)."""
    if path in _MOUNTED:
        _MOUNTED.discard(path)
        try:
            await asyncio.to_thread(tmpfs.unmount, path)
            os.rmdir(path)
            return
        except OSError as err:
            logger.error("could not unmount %s: %s", path, err)
    try:
        code, _, stderr = await _finished(_rm(path))
    except OSError as err:  # rm could not start (no processes left, no memory)
        code, stderr = -1, str(err)
    if code != 0:
        _removal_failed(path, code, stderr)


def remove_now(path: Path) -> bool:
    """`remove_call_dir` for where no event loop runs (the sweep's thread, exit): every tmpfs
    under `path` unmounted, then the rest removed; False (logged) when it failed."""
    try:
        tmpfs.unmount_all_under(path)
    except OSError as err:  # no /proc/self/mountinfo: rm then says what it could not remove
        logger.error("could not list the mounts under %s: %s", path, err)
    _MOUNTED.difference_update([p for p in _MOUNTED if p == path or path in p.parents])
    try:
        done = subprocess.run(_rm(path), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, close_fds=True)
    except OSError as err:
        _removal_failed(path, -1, str(err))
        return False
    if done.returncode != 0:
        _removal_failed(path, done.returncode, done.stderr.decode(errors="replace").strip())
    return done.returncode == 0


async def disk_usage(path: Path) -> int | None:
    """Bytes of disk that the files and directories under `path` take (`path` itself not counted;
    a file linked twice counts once), at any depth and path length, without blocking the event
    loop; None, logged, when some of it could not be measured. Allocated blocks, not apparent
    sizes: what fills the disk (a sparse file counts what it occupies)."""
    try:
        code, stdout, stderr = await _finished(_du(path))
        own = os.lstat(path).st_blocks * 512
    except OSError as err:
        code, stdout, stderr = -1, "", str(err)
    if code != 0 or not stdout.split("\t")[0].isdigit():
        logger.error("could not measure %s (du exited with %d): %s", path, code, stderr[:500] or "no message")
        return None
    return int(stdout.split("\t")[0]) - own


# ---- the jail ------------------------------------------------------------------------------


def _reachable(path: str) -> bool:
    """Can any user reach `path` (every directory above it searchable by others)?"""
    current = os.path.dirname(os.path.realpath(path))
    while True:
        if not os.stat(current).st_mode & stat.S_IXOTH:
            return False
        if current == "/":
            return True
        current = os.path.dirname(current)


@lru_cache(maxsize=1)
def interpreter() -> tuple[str, tuple[str, ...]]:
    """(the python that jailed code runs, the directories it needs besides /usr, read-only).

    The project's own interpreter and virtualenv where a leased uid can reach them; when they live
    where other users cannot (a root launcher under /root), the system's python3."""
    paths = tuple(sorted({os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)} - {"/usr"}))
    if os.geteuid() != 0 or all(_reachable(p) for p in (*paths, sys.executable)):
        return sys.executable, tuple(p for p in paths if not p.startswith("/usr/"))
    system = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    if system is None:
        raise SandboxUnavailable(f"jailed code cannot reach {sys.executable} (a directory above it is not searchable by other users) and there is no system python3")
    logger.info("jailed code runs %s (%s is not reachable by other users)", system, sys.executable)
    return system, ()


def _system_binds() -> list[str]:
    """The system's programs and libraries, read-only (merged-/usr layouts keep their symlinks)."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for path in ("/etc/ld.so.cache", "/etc/alternatives", "/etc/localtime"):
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    return args


def _limits(limits: SandboxConfig, uid: int | None) -> list[str]:
    """prlimit: resource limits of the call, set before the jail starts."""
    prlimit = shutil.which("prlimit") or "prlimit"
    args = [prlimit, f"--cpu={limits.cpu_s}:{limits.cpu_s + 1}", f"--as={limits.memory_mb * MIB}", f"--fsize={limits.file_size_mb * MIB}",
            f"--nofile={limits.max_open_files}", "--core=0"]
    if uid is not None:  # RLIMIT_NPROC counts the uid's processes: with a leased uid, the call's own
        args.append(f"--nproc={limits.max_processes}")
    return [*args, "--"]


def _drop_to(uid: int | None) -> list[str]:
    """setpriv: become the leased uid, with no supplementary groups and no way to gain privileges."""
    if uid is None:
        return []
    return [shutil.which("setpriv") or "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs", "--"]


def _bwrap(limits: SandboxConfig, area: CallArea, argv: list[str], read_only: tuple[str, ...]) -> list[str]:
    """bwrap, run as the leased uid: new user, mount, PID, network, IPC, UTS and cgroup namespaces."""
    python, needed = interpreter()
    binds = [arg for path in (*needed, *read_only) for arg in ("--ro-bind", path, path)]
    # `python` and `python3` mean the jail's interpreter (first on PATH).
    links = ["--dir", BIN_DIR, "--symlink", python, f"{BIN_DIR}/python", "--symlink", python, f"{BIN_DIR}/python3"]
    if area.scratch is not None:  # from the call's own capped tmpfs
        scratch = ["--bind", str(area.scratch / "tmp"), "/tmp", "--bind", str(area.scratch / "shm"), "/dev/shm"]
    else:
        scratch = ["--size", str(limits.tmp_mb * MIB), "--tmpfs", "/tmp", "--size", str(limits.tmp_mb * MIB), "--tmpfs", "/dev/shm"]
    work = str(area.work)
    return [
        _bwrap_path(), "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
        *(["--share-net"] if not limits.isolate_network else []),
        *_system_binds(), *binds, *links,
        "--proc", "/proc", "--dev", "/dev", *scratch,
        "--bind", work, work,
        # bwrap's own tmpfs under /, /dev and the directories it made has no size or file cap:
        # read-only once every mount point is made, so the call writes only where its quotas hold.
        "--remount-ro", "/dev", "--remount-ro", "/",
        "--chdir", work,
        "--", *argv,
    ]


@lru_cache(maxsize=1)
def _bwrap_path() -> str:
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxUnavailable(
            "bubblewrap (bwrap), which jails model-written code, is not installed: run scripts/install.sh as root (it installs the "
            "Debian package `bubblewrap`), or `apt-get install bubblewrap`"
        )
    return path


@lru_cache(maxsize=4)
def check_backend(backend: str) -> None:
    """Fail (once) with the reason and the fix when `backend` cannot jail a call here."""
    probe = [*_drop_to(65534 if os.geteuid() == 0 else None), _bwrap_path(), "--unshare-all", "--unshare-user", "--disable-userns",
             "--ro-bind", "/", "/", "--proc", "/proc", "--", "true"]
    done = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise SandboxUnavailable(
            f"bubblewrap cannot create a jail here ({done.stderr.strip()[:300] or f'exit {done.returncode}'}); it needs unprivileged "
            "user namespaces (sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0)"
        )


def jail_command(argv: list[str], area: CallArea, limits: SandboxConfig, uid: int | None, read_only: tuple[str, ...] = ()) -> list[str]:
    """The command that runs `argv` in `area`, jailed as `uid`, under `limits`; `read_only`
    paths are also visible. Each program execs the next: prlimit sets the limits, setpriv drops to
    the uid, bwrap then makes its namespaces as that uid."""
    return [*_limits(limits, uid), *_drop_to(uid), *_bwrap(limits, area, argv, read_only)]


# ---- running a call ------------------------------------------------------------------------


def read_cut(path: Path, limit: int) -> str:
    """The text of a capture file, cut to `limit` characters (saying so)."""
    with open(path, "rb") as handle:
        data = handle.read(limit * 4 + 1)
    text = data.decode("utf-8", errors="replace")
    if len(text) > limit or len(data) > limit * 4:
        return text[:limit] + f"\n...[truncated at {limit} characters]"
    return text


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


def _stopped_by(code: int | None, timed_out: bool, stderr: str, limits: SandboxConfig) -> str | None:
    """What ended the call, in words (None for a clean exit)."""
    if timed_out:
        return f"stopped at the wall-clock limit ({limits.timeout_s:g} s)"
    if code == 0:
        return None
    signum = -code if code is not None and code < 0 else (code - 128 if code is not None and 128 < code < 160 else None)
    if signum == signal.SIGXCPU:
        return f"stopped at the CPU limit ({limits.cpu_s} s)"
    if signum == signal.SIGKILL:
        return f"killed by SIGKILL (the CPU limit's hard stop at {limits.cpu_s + 1} s, or out of memory)"
    if signum == signal.SIGXFSZ or "[Errno 27] File too large" in stderr:
        return f"stopped at the file-size limit ({limits.file_size_mb} MiB per file)"
    if "MemoryError" in stderr or "Cannot allocate memory" in stderr:
        return f"ran out of memory at the limit ({limits.memory_mb} MiB) and exited with code {code}"
    if "Resource temporarily unavailable" in stderr or "BlockingIOError" in stderr:
        return f"hit the process limit ({limits.max_processes}) and exited with code {code}"
    if signum is not None:
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        return f"killed by {name}"
    return f"exited with code {code}"


ENVIRONMENT = {"TMPDIR": "/tmp", "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8",
               # A rewrite within the same second and of the same size would otherwise run stale bytecode.
               "PYTHONDONTWRITEBYTECODE": "1"}


def spawn(argv: list[str], area: CallArea, limits: SandboxConfig, uid: int | None, stdout: Any, stderr: Any,
          pass_fds: tuple[int, ...] = (), read_only: tuple[str, ...] = ()) -> subprocess.Popen:
    """Start `argv` jailed (see `jail_command`) with a scrubbed environment, in a new process group.
    No preexec_fn: CPython starts the chain by vfork (~1 ms; a fork of the launcher would stall
    the event loop ~30 ms per call)."""
    check_backend(limits.backend)
    env = {**ENVIRONMENT, "HOME": str(area.work), "PATH": f"{BIN_DIR}:/usr/local/bin:/usr/bin:/bin"}
    group = cgroups.create(limits.memory_mb, limits.max_processes)
    command = [*(group.join_command() if group else []), *jail_command(argv, area, limits, uid, read_only)]
    try:
        proc = subprocess.Popen(command, cwd="/", env=env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, close_fds=True,
                                pass_fds=pass_fds, start_new_session=True)
    except BaseException:
        if group is not None:
            group.remove()
        raise
    if group is not None:
        _GROUPS[proc.pid] = group
    return proc


# The control group of each started jail (opd.tools.cgroups), removed by `stop`.
_GROUPS: dict[int, cgroups.CallGroup] = {}


async def stop(proc: subprocess.Popen, uid: int | None = None) -> int:
    """Kill a jail, reap it and return its exit status: its processes die with it (PID namespace,
    die-with-parent); the group kill also ends the chain before the jail exists. The group is
    killed only while its leader is an unreaped child (nothing else can hold its pid or group
    then); only this function reaps. With `uid`, also wait (up to 5 s) until the kernel has reaped
    every process of that uid: the uid's next call counts them against its process limit, and a
    fork bomb's thousand children take a moment to go. Then its control group is removed."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await exited(proc)
        proc.wait()  # it has exited: returns at once
    if uid is not None:
        await wait_until_gone(uid)
    group = _GROUPS.pop(proc.pid, None)
    if group is not None:
        await asyncio.to_thread(group.remove)
    return proc.returncode


async def wait_until_gone(uid: int, timeout_s: float = 5.0) -> None:
    """Wait (up to `timeout_s`) until no process of `uid` is left."""
    await asyncio.to_thread(_wait_until_gone, uid, timeout_s)


def _processes_of(uid: int) -> int:
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if entry.stat(follow_symlinks=False).st_uid == uid:
                    count += 1
    return count


def _wait_until_gone(uid: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while _processes_of(uid) and time.monotonic() < deadline:
        time.sleep(0.02)


async def run_jailed(argv: list[str], area: CallArea, limits: SandboxConfig, uid: int | None) -> SandboxResult:
    """Run `argv` jailed in `area` as `uid` under `limits`, its output captured. Never raises for
    anything the command does; every process it started is gone when this returns."""
    started = time.monotonic()
    capture = scratch_dir("capture-")
    try:
        with open(capture / "out", "wb") as out, open(capture / "err", "wb") as err:
            proc = spawn(argv, area, limits, uid, out, err)
        timed_out = False
        try:
            await asyncio.wait_for(exited(proc), timeout=limits.timeout_s)
        except asyncio.TimeoutError:
            timed_out = True
        finally:
            code = await stop(proc)
            if uid is not None and code != 0:  # after a clean exit nothing of the uid is left to wait for
                await wait_until_gone(uid)
        stdout = read_cut(capture / "out", limits.output_chars)
        stderr = read_cut(capture / "err", limits.output_chars)
    finally:
        shutil.rmtree(capture, ignore_errors=True)
    return SandboxResult(stdout, stderr, None if timed_out else code, timed_out, _stopped_by(code, timed_out, stderr, limits), time.monotonic() - started)


def _noting_full(result: SandboxResult, root: Path, limits: SandboxConfig, what: str) -> SandboxResult:
    """`result` with `<what> full (...)` added to its error when the call's tmpfs at `root` is full."""
    words = tmpfs.full_words(root, tmpfs.Quota(limits.tmp_mb, limits.tmp_files), what) if is_tmpfs(root) else None
    return result if words is None else replace(result, error=f"{result.error or 'exited with code 0'}; {words}")


async def run_command(argv: list[str], workdir: Path, limits: SandboxConfig, uid: int | None) -> SandboxResult:
    """Run `argv` jailed in `workdir` (a workspace) as `uid` under `limits` (`run_jailed`); its
    /tmp and /dev/shm are a tmpfs of the call's own where the launcher may mount one."""
    if not tmpfs.available():
        return await run_jailed(argv, CallArea(workdir), limits, uid)
    root = make_call_dir("tmp-", uid, tmpfs.Quota(limits.tmp_mb, limits.tmp_files))
    try:
        _jail_dirs(root, ("tmp", "shm"), uid)
        result = await run_jailed(argv, CallArea(workdir, root), limits, uid)
        return _noting_full(result, root, limits, "its /tmp and /dev/shm are")
    finally:
        await remove_call_dir(root)


async def run_python(code: str, limits: SandboxConfig) -> SandboxResult:
    """Run `code` jailed in a fresh directory with a uid of its own (both gone afterwards)."""
    lease = UidLease.take(limits.uid_base)
    try:
        root, area = call_area("python-", lease.uid, limits)
    except BaseException:
        lease.release()
        raise
    try:
        snippet = area.work / "snippet.py"
        fd = os.open(snippet, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(code)
        result = await run_jailed([interpreter()[0], "-I", "-c", _RUNNER, str(snippet)], area, limits, lease.uid)
        return _noting_full(result, root, limits, "its directory, /tmp and /dev/shm are")
    finally:
        try:
            await remove_call_dir(root)
        finally:
            lease.release()
