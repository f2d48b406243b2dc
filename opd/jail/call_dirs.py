"""The directories jailed calls write in: one directory per launcher (`<tmp>/opd-sandbox-<pid>-*`)
holding a directory per workspace or call, each private to its uid; as root each is a tmpfs capped
in bytes and in files (`opd.jail.tmpfs`), counted by statvfs and removed by one unmount.

The launcher creates them itself and nothing it does follows a path the jailed code could have
changed (see `opd.tools.workspace` for the file tools). Jailed code decides what its directory
holds: chains thousands of directories deep, paths far longer than PATH_MAX, hundreds of
thousands of files. coreutils `du` and `rm` walk any of these (gnulib's fts: iterative, through
directory descriptors relative to their parent, never a full path), never follow a symlink (`du
--no-dereference`; `rm` removes a link itself) and stay on the file system of the directory they
were given (`--one-file-system`), so nothing outside it is read or touched. They run as
processes of their own, awaited through a pidfd: the event loop goes on meanwhile. Nothing of
the directory's jail runs while they do.
"""

from __future__ import annotations

import asyncio
import atexit
import fcntl
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from functools import lru_cache
from pathlib import Path

from opd.config import SandboxConfig
from opd.jail import tmpfs
from opd.jail.command import CallArea
from opd.jail.reaping import exited

logger = logging.getLogger(__name__)


class CallDirs:
    """One launcher's directory of call directories, and the tmpfs mounts it made under it: the
    one owner of both. Made with the launcher's pid in its name and a lock held for the life of
    the process, removed at exit; the directories of killed launchers found beside it (`base`,
    the temporary directory by default) are removed meanwhile by a thread (`sweeper`)."""

    def __init__(self, base: Path | None = None) -> None:
        base = base or Path(tempfile.gettempdir())
        stale = [path for path in base.glob("opd-sandbox-*") if path.is_dir() and not path.is_symlink() and launcher_gone(path)]
        self.root = Path(tempfile.mkdtemp(prefix=f"opd-sandbox-{os.getpid()}-", dir=base))
        os.chmod(self.root, 0o711)  # leased uids may enter their own directory, not list the others
        # Call directories that are tmpfs mount points (`make` with a quota, as root).
        self._mounted: set[Path] = set()
        fd = os.open(self.root / ".owner", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)  # held for the life of this process
        atexit.register(self.remove_now, self.root)
        # The thread removing the directories of killed launchers (None when there were none).
        self.sweeper: threading.Thread | None = None
        if stale:
            self.sweeper = threading.Thread(target=self._sweep, args=(stale,), name="opd-sandbox-sweep", daemon=True)
            self.sweeper.start()

    def _sweep(self, stale: list[Path]) -> None:
        """Remove killed launchers' directories, one after another; one that cannot be removed is
        logged and left."""
        for path in stale:
            self.remove_now(path)

    def make(self, prefix: str, uid: int | None, quota: tmpfs.Quota | None = None) -> Path:
        """A fresh directory for a workspace or a call, owned by `uid`, private to it; with `quota`,
        where the launcher may mount (`tmpfs.available`), a tmpfs of that size and number of files."""
        path = Path(tempfile.mkdtemp(prefix=prefix, dir=self.root))
        if quota is not None and tmpfs.available():
            try:
                tmpfs.mount(path, quota, uid)
            except OSError:
                os.rmdir(path)
                raise
            self._mounted.add(path)
            return path
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            if uid is not None:
                os.fchown(fd, uid, uid)
            os.fchmod(fd, 0o700)
        finally:
            os.close(fd)
        return path

    def is_tmpfs(self, path: Path) -> bool:
        """Is `path` a call directory with a tmpfs (and so a quota the kernel holds) of its own?"""
        return path in self._mounted

    def area(self, prefix: str, uid: int | None, limits: SandboxConfig) -> tuple[Path, CallArea]:
        """A call directory of its own (a tmpfs of `tmp_mb` and `tmp_files` where possible) holding
        the call's directory and its /tmp and /dev/shm, all owned by `uid`: (the directory to remove
        afterwards, the area to run in)."""
        root = self.make(prefix, uid, tmpfs.Quota(limits.tmp_mb, limits.tmp_files))
        if not self.is_tmpfs(root):
            return root, CallArea(root)
        try:
            jail_dirs(root, ("work", "tmp", "shm"), uid)
        except BaseException:
            self.remove_now(root)
            raise
        return root, CallArea(root / "work", root)

    def scratch(self, prefix: str) -> Path:
        """A fresh root-only directory (captured output, pipes' partners): no jailed code can reach it."""
        return Path(tempfile.mkdtemp(prefix=prefix, dir=self.root))

    async def remove(self, path: Path) -> None:
        """Remove a call directory, whatever it holds, without blocking the event loop. A failure is
        logged, never raised: the caller goes on (and frees its uid). A tmpfs is unmounted (at once,
        whatever it holds; its memory is freed on a thread)."""
        if path in self._mounted:
            self._mounted.discard(path)
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

    def remove_now(self, path: Path) -> bool:
        """`remove` for where no event loop runs (the sweep's thread, exit): every tmpfs under
        `path` unmounted, then the rest removed; False (logged) when it failed."""
        try:
            tmpfs.unmount_all_under(path)
        except OSError as err:  # no /proc/self/mountinfo: rm then says what it could not remove
            logger.error("could not list the mounts under %s: %s", path, err)
        self._mounted.difference_update([p for p in self._mounted if p == path or path in p.parents])
        try:
            done = subprocess.run(_rm(path), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, close_fds=True)
        except OSError as err:
            _removal_failed(path, -1, str(err))
            return False
        if done.returncode != 0:
            _removal_failed(path, done.returncode, done.stderr.decode(errors="replace").strip())
        return done.returncode == 0


@lru_cache(maxsize=1)
def launcher_dirs() -> CallDirs:
    """This process's `CallDirs`, made when a call first needs one (one per launcher process: its
    name and its lock are the process's)."""
    return CallDirs()


def launcher_gone(directory: Path) -> bool:
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


def jail_dirs(root: Path, names: tuple[str, ...], uid: int | None) -> None:
    """Make the directories `names` in a fresh call directory, owned by `uid`, private to it."""
    for name in names:
        os.mkdir(root / name, 0o700)
        if uid is not None:
            os.chown(root / name, uid, uid, follow_symlinks=False)


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
