"""Uids for jailed code: when the launcher runs as root, each workspace or python call runs as a
uid of its own (`uid_base` onwards), leased through a lock file per uid, never held by two at once,
also across launchers on one machine. A bind that leaked would then not let one rollout read or
write another's files or signal its processes, and the process limit (RLIMIT_NPROC, counted per
uid) is the call's own.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import random
import stat
from functools import lru_cache
from pathlib import Path

from opd.jail.command import SandboxUnavailable

logger = logging.getLogger(__name__)

# Leased uids: this many above uid_base.
UID_COUNT = 60_000


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
    releases its locks, and its uid is taken again). None as `uid` means the launcher is not root:
    calls keep its uid.

    The lock files do not pile up (one per uid ever leased, up to `UID_COUNT`): a lease removes its
    file when it is released, while it still holds the lock. A lease is held only by whoever locks
    the file that is linked under the uid's name at that moment: a taker that locks a file someone
    removed meanwhile (it opened the name just before the removal) finds another file, or none,
    under that name and tries the next uid. A file is only ever removed by its lock's holder, so
    once a taker has checked the name after locking, the name stays its own until it releases it.
    A holder that died leaves its file behind, unlocked: the next taker of that uid locks and keeps
    it, and removes it in turn."""

    def __init__(self, uid: int | None, fd: int | None, path: Path | None = None) -> None:
        self.uid, self._fd, self._path = uid, fd, path

    @classmethod
    def take(cls, base: int) -> "UidLease":
        if os.geteuid() != 0:
            return cls(None, None)
        lock_dir = _lock_dir()
        start = random.randrange(UID_COUNT)
        for step in range(UID_COUNT):
            uid = base + (start + step) % UID_COUNT
            path = lock_dir / str(uid)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            if not _still_linked(fd, path):  # its holder removed it as it released it: not a lease
                os.close(fd)
                continue
            return cls(uid, fd, path)
        raise SandboxUnavailable(f"all {UID_COUNT} sandbox uids from {base} are leased")

    def release(self) -> None:
        """Free the uid: its lock file removed while still locked, then unlocked."""
        if self._fd is not None:
            try:
                if self._path is not None:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(self._path)
            finally:
                os.close(self._fd)
                self._fd = None


def _still_linked(fd: int, path: Path) -> bool:
    """Is the file open as `fd` the one linked at `path`?"""
    try:
        linked = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (linked.st_dev, linked.st_ino) == (mine.st_dev, mine.st_ino)
