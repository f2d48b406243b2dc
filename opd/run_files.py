"""The files of a run directory, opened so that a crafted directory cannot turn them against its
owner.

A run directory can come from elsewhere (`resume=true hydra.run.dir=<a directory someone handed
you>`, a sweep on shared storage): any name in it may be a symbolic link to one of your files, a
FIFO that blocks whoever opens it, a device, or a hard link. Every file the project opens,
creates, truncates or replaces in a run directory goes through this module:

- the last component is never followed (`O_NOFOLLOW`) and an open never blocks (`O_NONBLOCK`,
  cleared again once the file is known to be regular);
- the open descriptor is checked (`fstat`) before a byte is read, written or cut: a regular file,
  and, for writing, one with a single link (so no other name of it changes);
- a file is truncated only through that checked descriptor, never by `O_TRUNC`;
- a file replaced whole is written to a fresh temporary name (`O_EXCL`) and renamed over it;
- a directory made here is a directory of its own, not a link to one.

Anything else is a `RunFileError`: one line naming the path and what it is. Intermediate
directories above the run directory are the user's choice (a run directory may itself be a link
to scratch space); within it, callers make each level with `make_dir`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import logging
import os
import stat
import tempfile
from pathlib import Path
from typing import IO, Any, Iterator

_KINDS = {stat.S_IFLNK: "a symbolic link", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFDIR: "a directory"}
# Open flags per mode (`open`'s spelling); text modes are these plus an encoding.
_FLAGS = {"r": os.O_RDONLY, "r+": os.O_RDWR, "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND, "w": os.O_WRONLY | os.O_CREAT}


class RunFileError(OSError):
    """A name in a run directory that is not a regular file of its own (a link, a FIFO, a device,
    a directory, a file with other names): refused, nothing read or changed."""

    def __init__(self, path: str | os.PathLike[str], what: str) -> None:
        super().__init__(errno.EPERM, f"{os.fspath(path)} is {what}; a run directory's files must be regular files of their own (refused; left as it is)")
        self.path = os.fspath(path)

    def __str__(self) -> str:
        return str(self.args[1])


def kind(mode: int) -> str:
    """What a file of `st_mode` is, in words (`a FIFO`)."""
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def open_fd(path: str | os.PathLike[str], mode: str = "r", *, follow: bool = False, create_mode: int = 0o644) -> int:
    """A descriptor of the regular file `path`, opened for `mode` (`r`, `r+`, `a`, `w`; `w`
    truncates through the checked descriptor). `follow=True` follows a symbolic link the user
    named (a command line's argument), never one inside a run directory."""
    base = mode.replace("b", "").replace("t", "")
    flags = _FLAGS[base] | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags, create_mode)
    except OSError as err:
        if err.errno == errno.ELOOP and not follow:
            raise RunFileError(path, "a symbolic link") from None
        if err.errno == errno.ENXIO:  # a FIFO without a reader, opened for writing; a socket
            raise RunFileError(path, kind(os.lstat(path).st_mode)) from None
        if err.errno == errno.EISDIR:
            raise RunFileError(path, "a directory") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise RunFileError(path, kind(info.st_mode))
        if base != "r" and info.st_nlink > 1:
            raise RunFileError(path, f"a file with {info.st_nlink} hard links")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        if base == "w":
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_file(path: str | os.PathLike[str], mode: str = "r", *, encoding: str | None = "utf-8", follow: bool = False) -> IO[Any]:
    """`open(path, mode)` for a run directory's regular file (see `open_fd`): binary for modes
    with `b`, else text in `encoding`."""
    fd = open_fd(path, mode, follow=follow)
    binary = "b" in mode
    try:
        return os.fdopen(fd, mode, **({} if binary else {"encoding": encoding}))
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str | os.PathLike[str], limit: int = 1 << 26) -> bytes:
    """The bytes of a small regular file (at most `limit`: a longer one is an error)."""
    with open_file(path, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise RunFileError(path, f"longer than {limit} bytes")
    return data


def read_text(path: str | os.PathLike[str], limit: int = 1 << 26) -> str:
    return read_bytes(path, limit).decode("utf-8")


def lstat_kind(path: str | os.PathLike[str]) -> str | None:
    """None when `path` does not exist or is a regular file of its own; else what it is (`a
    symbolic link`, `a FIFO`, `a file with 2 hard links`), without following or opening it."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(info.st_mode):
        return kind(info.st_mode)
    return f"a file with {info.st_nlink} hard links" if info.st_nlink > 1 else None


def check_name(path: str | os.PathLike[str]) -> None:
    """Raise RunFileError unless `path` is absent or a regular file of its own (`lstat_kind`)."""
    if (what := lstat_kind(path)) is not None:
        raise RunFileError(path, what)


def replace_file(path: str | os.PathLike[str], data: bytes | str, *, fsync: bool = False) -> Path:
    """Write `data` as the whole of `path`: to a fresh temporary name beside it, then renamed over
    it (a reader sees the old file or the new one). An existing `path` that is not a regular file
    of its own is refused (the rename would not follow it; the refusal says so, once)."""
    with replacing(path, fsync=fsync) as out:
        out.write(data.encode("utf-8") if isinstance(data, str) else data)
    return Path(path)


@contextlib.contextmanager
def replacing(path: str | os.PathLike[str], *, fsync: bool = False, replace: bool = True) -> Iterator[IO[bytes]]:
    """`replace_file` for content written in pieces: a binary file at a fresh hidden temporary
    name beside `path` (`.NAME.*.tmp`), renamed over `path` when the block ends, removed if it
    raises. `replace=False`: a `path` that exists when the block ends, even one made while it ran,
    is left as it is (FileExistsError): the file is placed by `link`, which refuses an existing
    name atomically (a rename would replace it)."""
    path = Path(path)
    check_name(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # O_EXCL | O_NOFOLLOW
    try:
        with os.fdopen(fd, "wb") as out:
            yield out
            if fsync:
                out.flush()
                os.fsync(out.fileno())
        os.chmod(tmp, 0o644)
        if replace:
            os.replace(tmp, path)
        else:
            _place_new(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _place_new(tmp: str, path: Path) -> None:
    """Give the file `tmp` the name `path` unless that name exists (FileExistsError); `tmp` is then
    gone. On a file system without hard links, checked and renamed (a name made between the two
    is replaced: the one case that is not atomic)."""
    try:
        os.link(tmp, path)
    except OSError as err:
        if err.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS):
            raise
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fspath(path)) from None
        os.rename(tmp, path)
        return
    os.unlink(tmp)


def make_dir(path: str | os.PathLike[str]) -> Path:
    """`path` as a directory of its own: made (its parents too) when absent; an existing one that
    is a link, a file or anything but a directory is refused. Only the last component is checked:
    make each level within a run directory with its own call."""
    path = Path(path)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(path)
        except FileExistsError:  # made meanwhile (another job): checked below
            pass
        info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise RunFileError(path, kind(info.st_mode))
    return path


def check_tree(directory: str | os.PathLike[str]) -> None:
    """Before a writer that opens files by name (a checkpoint's `save_pretrained`) writes into
    `directory`: the directory and everything in it are directories or regular files of their own."""
    root = make_dir(directory)
    for parent, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            entry = Path(parent) / name
            info = os.lstat(entry)
            if stat.S_ISDIR(info.st_mode):
                continue
            if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
                raise RunFileError(entry, kind(info.st_mode) if not stat.S_ISREG(info.st_mode) else f"a file with {info.st_nlink} hard links")


class LogFile(logging.FileHandler):
    """`logging.FileHandler` for a run's log (`conf/hydra/job_logging/opd.yaml`): the file opened
    as every run file is (a link or a FIFO in its place is refused, not followed or waited on)."""

    def _open(self) -> io.TextIOWrapper:
        return open_file(self.baseFilename, self.mode, encoding=self.encoding or "utf-8")  # type: ignore[return-value]
