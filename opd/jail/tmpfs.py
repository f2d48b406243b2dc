"""A size- and inode-capped tmpfs per call directory: the disk quota that holds while a call runs.

A root launcher mounts a tmpfs of its own on each rollout's workspace, each python call's
directory, each of the reward's two jails, and each call's /tmp and /dev/shm (`mount -t tmpfs
-o size=...,nr_inodes=...`, with the mount(2) call itself). The kernel then refuses, with ENOSPC
("No space left on device"), any write past its bytes or its files, as it happens: no call can
fill the machine's disk or use up its inodes, whatever it writes and however fast. What a tmpfs
holds is RAM (charged to the call's control group while the call writes it) and is gone when it
is unmounted, at once and whatever its depth or number of files. `statvfs` says what it holds.

Where mounting is not possible (a launcher that is not root), `available()` says so once with a
warning, and the callers fall back to measuring after each call (`opd.jail.call_dirs.disk_usage`).
Mounts left by a launcher that was killed are unmounted by the next one (`unmount_all_under`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

logger = logging.getLogger(__name__)

MIB = 1024 * 1024
# mount(2) flags: no set-uid programs, no device files on a call's tmpfs.
MS_NOSUID, MS_NODEV = 2, 4
MNT_DETACH = 2


@dataclass(frozen=True)
class Quota:
    """What one tmpfs may hold: MiB and files (directories count as files)."""

    mb: int
    files: int


@dataclass(frozen=True)
class Usage:
    """What a tmpfs holds and may hold, from statvfs: bytes and files (its root not counted)."""

    used_bytes: int
    size_bytes: int
    used_files: int
    max_files: int

    @property
    def full(self) -> bool:
        """No room for one more page or one more file."""
        return self.used_bytes >= self.size_bytes or self.used_files >= self.max_files


@lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _oserror(what: str, path: Path) -> OSError:
    errno = ctypes.get_errno()
    return OSError(errno, f"{what} {path}: {os.strerror(errno)}")


def mount(path: Path, quota: Quota, uid: int | None) -> None:
    """Mount a tmpfs of `quota` on the directory `path` (its root owned by `uid`, mode 0700).
    Raises OSError when the kernel refuses."""
    # nr_inodes counts the root directory too.
    options = f"size={quota.mb * MIB},nr_inodes={quota.files + 1},mode=0700"
    if uid is not None:
        options += f",uid={uid},gid={uid}"
    done = _libc().mount(b"tmpfs", os.fsencode(path), b"tmpfs", MS_NOSUID | MS_NODEV, options.encode())
    if done != 0:
        raise _oserror("cannot mount a tmpfs on", path)


def unmount(path: Path) -> None:
    """Detach the tmpfs on `path` (its memory is freed once nothing uses it). Blocking: freeing a
    full tmpfs takes a while, so async callers run it in a thread. Raises OSError."""
    if _libc().umount2(os.fsencode(path), MNT_DETACH) != 0:
        raise _oserror("cannot unmount", path)


def usage(path: Path) -> Usage:
    """What the tmpfs on `path` holds (one statvfs: instant, whatever it holds)."""
    info = os.statvfs(path)
    return Usage((info.f_blocks - info.f_bfree) * info.f_frsize, info.f_blocks * info.f_frsize,
                 info.f_files - info.f_ffree - 1, info.f_files - 1)


def full_words(path: Path, quota: Quota, what: str) -> str | None:
    """`<what> full (quota: N MiB)` (or `N files`) when the tmpfs on `path` is full, else None;
    `what` brings its verb: "the workspace is"."""
    try:
        now = usage(path)
    except OSError:
        return None
    if not now.full:
        return None
    return f"{what} full (quota: {quota.mb} MiB)" if now.used_bytes >= now.size_bytes else f"{what} full (quota: {quota.files} files)"


@lru_cache(maxsize=1)
def available() -> bool:
    """Can this launcher mount a tmpfs per call (root, and the kernel lets it)? Checked once, by
    mounting one; a warning when not."""
    if os.geteuid() != 0:
        logger.warning("sandboxed calls get no tmpfs of their own (the launcher is not root): a workspace's quota is checked "
                       "after each call, not while it runs, and neither a call's files nor a python call's directory are bounded")
        return False
    import contextlib
    import tempfile

    probe = Path(tempfile.mkdtemp(prefix="opd-tmpfs-probe-"))
    try:
        mount(probe, Quota(1, 16), None)
        unmount(probe)
        return True
    except OSError as err:
        logger.warning("sandboxed calls get no tmpfs of their own (%s): a workspace's quota is checked after each call, not "
                       "while it runs, and neither a call's files nor a python call's directory are bounded", err)
        return False
    finally:
        with contextlib.suppress(OSError):  # still mounted only if the unmount failed: said above
            os.rmdir(probe)


def _unescape(field: str) -> str:
    """A path as /proc/self/mountinfo writes it (space, tab, newline, backslash as octal escapes)."""
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def mounts_under(path: Path) -> list[Path]:
    """Mount points at or below `path` in this process's mount namespace, deepest first."""
    top = os.path.realpath(path)
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as info:
        for line in info:
            point = _unescape(line.split(" ", 5)[4])
            if point == top or point.startswith(top.rstrip("/") + "/"):
                found.append(Path(point))
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def unmount_all_under(path: Path) -> bool:
    """Unmount every mount at or below `path` (a killed launcher's); False (logged) if one stays."""
    ok = True
    for point in mounts_under(path):
        try:
            unmount(point)
        except OSError as err:
            logger.error("%s", err)
            ok = False
    return ok
