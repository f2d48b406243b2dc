"""The jail of one call: the command line that runs a program under bubblewrap (`bwrap`) with its
limits, as its own uid, and the started jail (its leader and its control group).

Each program of the chain execs the next: `prlimit` sets the resource limits (CPU seconds, address
space, file size, open files, processes, no core dumps), `setpriv` drops to the leased uid, `bwrap`
makes new user, mount, PID, network, IPC, UTS and cgroup namespaces as that uid: the interpreter
and the system's libraries read-only, the call's directory and a private /tmp and /dev/shm the only
writable places, its own /proc, no network, no new user namespaces, a new session, and it dies with
its parent. Where the launcher may create control groups, the chain starts inside one with a memory
and a process limit for all the call's processes together (`opd.jail.cgroups`).

With a leased uid (a root launcher), the jail's leader is `unshare`, which forks the rest of the
chain as the first process of a PID namespace of its own and reaps it (`_reaped_namespace`): the
leader exits only once every process of the call has exited and been reaped, so the call ends as
soon as its processes are gone, whatever its exit status, and leaves no zombie of its uid behind.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from opd.config import SandboxConfig
from opd.jail import cgroups

logger = logging.getLogger(__name__)

MIB = 1024 * 1024
# Inside a bwrap jail: where `python` and `python3` link to the jail's interpreter.
BIN_DIR = "/opd/bin"


class SandboxUnavailable(RuntimeError):
    """The configured backend cannot run here; the message says why and what to do."""


@dataclass(frozen=True)
class CallArea:
    """Where one jailed call writes: `work` (its directory) and, when `scratch` is set, the /tmp and
    /dev/shm it binds from that tmpfs (`scratch`/tmp, `scratch`/shm; else bwrap's own of tmp_mb)."""

    work: Path
    scratch: Path | None = None


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


def _reaped_namespace(uid: int | None) -> list[str]:
    """With a leased uid: the rest of the chain forked by `unshare` as the first process of a new PID
    namespace, and reaped by it (the jail's leader, root).

    bwrap's monitor (the first process of the jail, as the uid) exits as soon as the jailed program
    has, while its init (pid 1 of bwrap's own namespace) is still tearing the jail down; that init
    was then orphaned to the machine's pid 1, which reaped it when it got round to it (~2 s here),
    and until then the zombie held one of the uid's RLIMIT_NPROC slots. Here the monitor is itself
    the first process of a namespace: when it exits the kernel kills every process of that namespace
    (bwrap's nests inside it: all of the call's processes, whatever they forked, wherever their
    session) and waits until each has been reaped before the monitor can be; only then does
    `unshare` reap it and exit. So the leader's exit means nothing of the call is left, zombies
    included, and nothing is polled. `setpriv --pdeathsig` ties `unshare` to the launcher (the
    monitor is tied to `unshare` by bwrap's --die-with-parent), `--kill-child` its child to it until
    bwrap has started."""
    if uid is None or not reaped_namespaces():
        return []
    setpriv, unshare = shutil.which("setpriv") or "setpriv", shutil.which("unshare") or "unshare"
    return [setpriv, "--pdeathsig", "KILL", "--", unshare, "--pid", "--fork", "--kill-child", "--"]


@lru_cache(maxsize=1)
def reaped_namespaces() -> bool:
    """Can this (root) launcher give each jail a PID namespace of its own (`_reaped_namespace`)? It
    needs CAP_SYS_ADMIN, which a root launcher in a container may lack: then a warning, and a failed
    call waits for its uid's processes instead (`opd.jail.reaping.stop`)."""
    try:
        done = subprocess.run([shutil.which("unshare") or "unshare", "--pid", "--fork", "--kill-child", "--", "true"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        done = subprocess.CompletedProcess([], -1, "", str(err))
    if done.returncode != 0:
        logger.warning("jailed calls get no PID namespace of their own to be reaped in (unshare --pid: %s); each call then waits "
                       "until its uid's processes are gone, which is slow where the machine's pid 1 reaps late",
                       done.stderr.strip()[:300] or f"exit {done.returncode}")
    return done.returncode == 0


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
    paths are also visible. Each program execs the next: prlimit sets the limits, (with a uid)
    unshare forks the rest in a PID namespace of its own and reaps it, setpriv drops to the uid,
    bwrap then makes its namespaces as that uid."""
    return [*_limits(limits, uid), *_reaped_namespace(uid), *_drop_to(uid), *_bwrap(limits, area, argv, read_only)]


# The jailed program's whole environment (with HOME and PATH).
ENVIRONMENT = {"TMPDIR": "/tmp", "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8",
               # A rewrite within the same second and of the same size would otherwise run stale bytecode.
               "PYTHONDONTWRITEBYTECODE": "1"}


@dataclass
class Jail:
    """A started jail: the leader of its chain (a process group of its own) and the control group
    it runs in (None where the launcher may not create one). It owns that group: `opd.jail.reaping.stop`
    kills the jail, reaps it and removes the group. `reaps_all`: the leader is `unshare`, which exits
    only once every process of the call has been reaped (`_reaped_namespace`)."""

    proc: subprocess.Popen
    group: cgroups.CallGroup | None
    reaps_all: bool = False


def spawn(argv: list[str], area: CallArea, limits: SandboxConfig, uid: int | None, stdout: Any, stderr: Any,
          pass_fds: tuple[int, ...] = (), read_only: tuple[str, ...] = ()) -> Jail:
    """Start `argv` jailed (see `jail_command`) with a scrubbed environment, in a new process group.
    No preexec_fn: CPython starts the chain by vfork (~1 ms; a fork of the launcher would stall
    the event loop ~30 ms per call)."""
    check_backend(limits.backend)
    env = {**ENVIRONMENT, "HOME": str(area.work), "PATH": f"{BIN_DIR}:/usr/local/bin:/usr/bin:/bin"}
    reaps_all = uid is not None and reaped_namespaces()
    # The leader `unshare` (root, not the uid's) is in the group too: the call keeps its max_processes.
    group = cgroups.create(limits.memory_mb, limits.max_processes + int(reaps_all))
    command = [*(group.join_command() if group else []), *jail_command(argv, area, limits, uid, read_only)]
    try:
        proc = subprocess.Popen(command, cwd="/", env=env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, close_fds=True,
                                pass_fds=pass_fds, start_new_session=True)
    except BaseException:
        if group is not None:
            group.remove()
        raise
    return Jail(proc, group, reaps_all)
