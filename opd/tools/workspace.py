"""The coding agent's tools over one rollout's workspace: write_file, read_file, terminal, patch
(`TOOLS`, run against a `Workspace` bound in a `Toolbox`).

A workspace is a directory of its own with a uid of its own (`opd.jail.call_dirs`, `opd.jail.uids`); `terminal`
runs `bash -c` jailed in it. As root it is a tmpfs of `workspace_mb` and `workspace_files`
(`opd.jail.tmpfs`): no call and no file tool writes past them, and a call that filled it says so;
elsewhere its size is measured after each call, and a call that left too much empties it.

The file tools run in the launcher, as root when it is root, so they
never follow a path the jailed code could have changed: every path is resolved one component at a
time from the workspace's own descriptor, refusing symlinks (O_NOFOLLOW) and `..`; files open
non-blocking and anything but a regular file (a FIFO, a socket) is refused, so no call can stall
the run. What they write belongs to the workspace's uid. A refused or failed call raises
`ToolError`, which the toolbox turns into an error result for the model.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import re
import stat
from pathlib import PurePosixPath

from opd.config import SandboxConfig
from opd.registry import Registry
from opd.tools.registry import Tool, ToolError, toolset
from opd.jail import tmpfs
from opd.jail.call_dirs import CallDirs, disk_usage, launcher_dirs
from opd.jail.sandbox import run_command
from opd.jail.uids import UidLease

logger = logging.getLogger(__name__)

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# The deepest path and the longest path the file tools take: they walk (and make) one directory
# per component on the event loop, so a path thousands deep would hold it for a second.
MAX_PATH_PARTS = 32
MAX_PATH_CHARS = 4096


class Workspace:
    """A fresh directory and uid for one rollout; `await close()` removes the directory, frees the uid.
    The directory is made in `dirs` (the launcher's by default), as are its calls' /tmp and /dev/shm."""

    def __init__(self, limits: SandboxConfig, max_file_chars: int = 20_000, dirs: CallDirs | None = None) -> None:
        self.limits = limits
        self.dirs = dirs or launcher_dirs()
        self.max_file_chars = max_file_chars
        self.lease = UidLease.take(limits.uid_base)
        self.quota = tmpfs.Quota(limits.workspace_mb, limits.workspace_files)
        try:
            self.root = self.dirs.make("rollout-", self.lease.uid, self.quota)
        except BaseException:
            self.lease.release()
            raise
        # Without a tmpfs: set when a call left more than `limits.workspace_mb` behind (the files
        # are removed and every later call is refused).
        self.over_quota = False

    async def close(self) -> None:
        """Remove the directory (off the event loop; a failure is logged) and free the uid."""
        try:
            await self.dirs.remove(self.root)
        finally:
            self.lease.release()

    # ---- paths ------------------------------------------------------------------------------

    def _parts(self, path: str) -> list[str]:
        if not path.strip():
            raise ToolError("path must be a non-empty string")
        if "\x00" in path:
            raise ToolError("path contains a NUL byte")
        if len(path) > MAX_PATH_CHARS:
            raise ToolError(f"path longer than {MAX_PATH_CHARS} characters")
        pure = PurePosixPath(path)
        if pure.is_absolute():
            raise ToolError(f"absolute paths are not allowed: {path}")
        if ".." in pure.parts:
            raise ToolError(f"'..' is not allowed in paths: {path}")
        parts = [p for p in pure.parts if p != "."]
        if not parts:
            raise ToolError(f"not a file path: {path}")
        if len(parts) > MAX_PATH_PARTS:
            raise ToolError(f"path deeper than {MAX_PATH_PARTS} directories: {path[:200]}")
        return parts

    def _parent(self, path: str, create: bool) -> tuple[int, str]:
        """(descriptor of the file's directory, the file's name); directories are opened one at a
        time with O_NOFOLLOW (and made, owned by the workspace's uid, when `create`)."""
        if self.over_quota:
            raise ToolError(f"the workspace went over its {self.limits.workspace_mb} MiB quota; its files were removed")
        parts = self._parts(path)
        fd = os.open(self.root, _DIR)
        try:
            for part in parts[:-1]:
                child = self._subdirectory(fd, part, path, create)
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return fd, parts[-1]

    def _subdirectory(self, fd: int, part: str, path: str, create: bool) -> int:
        """A descriptor of directory `part` in `fd` (made when `create` and missing); whatever
        the jailed code swapped in meanwhile is an error result, never an exception."""
        try:
            try:
                return os.open(part, _DIR, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise ToolError(f"no such directory: {part} in {path}") from None
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
                child = os.open(part, _DIR, dir_fd=fd)
                self._own(child)
                return child
        except OSError as err:
            if err.errno == errno.ENOTDIR:  # O_DIRECTORY on a symlink says ENOTDIR: say which it was
                with contextlib.suppress(OSError):
                    if stat.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode):
                        raise ToolError(f"symlinks are not allowed: {path}") from None
            raise ToolError(_why(err, path)) from None

    def _own(self, fd: int) -> None:
        if self.lease.uid is not None:
            os.fchown(fd, self.lease.uid, self.lease.uid)

    def _open_file(self, path: str, flags: int, create: bool) -> int:
        """A descriptor of a regular file inside the workspace (never a symlink, FIFO or device)."""
        parent, name = self._parent(path, create)
        try:
            fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644, dir_fd=parent)
        except OSError as err:
            raise ToolError(_why(err, path)) from None
        finally:
            os.close(parent)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise ToolError(f"not a regular file: {path}")
        return fd

    # ---- the tools --------------------------------------------------------------------------

    def write_file(self, path: str, content: str) -> str:
        if len(content) > self.max_file_chars:
            raise ToolError(f"content longer than {self.max_file_chars} characters")
        data = content.encode("utf-8")
        fd = self._open_file(path, os.O_WRONLY | os.O_CREAT, create=True)
        try:
            os.ftruncate(fd, 0)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            self._own(fd)
        except OSError as err:
            raise ToolError(_why(err, path)) from None
        finally:
            os.close(fd)
        return f"wrote {len(data)} bytes to {path}"

    def read_bytes(self, path: str, limit: int) -> bytes:
        """Up to `limit` + 1 bytes of a file (one more tells the caller it is longer)."""
        fd = self._open_file(path, os.O_RDONLY, create=False)
        try:
            chunks, left = [], limit + 1
            while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
                chunks.append(chunk)
                left -= len(chunk)
            return b"".join(chunks)
        except OSError as err:
            raise ToolError(_why(err, path)) from None
        finally:
            os.close(fd)

    def read_file(self, path: str) -> str:
        text = self.read_bytes(path, 4 * self.max_file_chars).decode("utf-8", errors="replace")
        if len(text) > self.max_file_chars:
            return text[: self.max_file_chars] + f"\n...[truncated at {self.max_file_chars} characters]"
        return text

    def patch(self, path: str, old: str, new: str) -> str:
        if not old:
            raise ToolError("patch needs a non-empty `old`")
        data = self.read_bytes(path, 4 * self.max_file_chars)
        current = data.decode("utf-8", errors="replace")
        if len(current) > self.max_file_chars:
            raise ToolError(f"{path} is longer than {self.max_file_chars} characters; patch works on smaller files")
        count = current.count(old)
        if count != 1:
            raise ToolError(f"`old` occurs {count} times in {path}; it must occur exactly once")
        self.write_file(path, current.replace(old, new, 1))
        return f"patched {path}"

    async def terminal(self, command: str) -> str:
        if not command.strip():
            raise ToolError("command must be a non-empty string")
        if "\x00" in command:  # no argv can hold one: exec would refuse it (ValueError) before the jail
            raise ToolError("command contains a NUL byte")
        if self.over_quota:
            raise ToolError(f"the workspace went over its {self.limits.workspace_mb} MiB quota; its files were removed")
        result = await run_command(["/bin/bash", "-c", command], self.root, self.limits, self.lease.uid, self.dirs)
        output = result.stdout + result.stderr
        status = f"timed out after {self.limits.timeout_s:g} s" if result.timed_out else terminal_status(result.exit_code, result.error)
        if self.dirs.is_tmpfs(self.root):
            if words := tmpfs.full_words(self.root, self.quota, "the workspace is"):
                status += f"; {words}"
        elif await self.used_mb() > self.limits.workspace_mb:
            await self._clear()
            status += f"; the workspace went over its {self.limits.workspace_mb} MiB quota and its files were removed"
        return f"{output}[{status}]"

    async def used_mb(self) -> float:
        """Space the workspace's files take, at any depth (its tmpfs's own count, or
        `call_dirs.disk_usage`; nothing of the workspace runs meanwhile); infinite when it could not
        be measured, so that what cannot be measured cannot escape the quota."""
        if self.dirs.is_tmpfs(self.root):
            return tmpfs.usage(self.root).used_bytes / (1024 * 1024)
        used = await disk_usage(self.root)
        return math.inf if used is None else used / (1024 * 1024)

    async def _clear(self) -> None:
        logger.warning("a workspace went over its %d MiB quota; its files were removed", self.limits.workspace_mb)
        await self.dirs.remove(self.root)
        self.root = self.dirs.make("rollout-", self.lease.uid)
        self.over_quota = True


def terminal_status(exit_code: int | None, stopped: str | None) -> str:
    """`exit code N`, and in words what stopped the command when a signal or a limit did, or what
    it filled (the model reads `exit code 152: stopped at the CPU limit (10 s)`, not a bare 152)."""
    notes = re.sub(r"^exited with code -?\d+", "", stopped or "")
    if notes == (stopped or ""):  # a signal or a limit stopped it
        return f"exit code {exit_code}: {stopped}" if stopped else f"exit code {exit_code}"
    return f"exit code {exit_code}{notes}"  # "; <what it filled>", or nothing


def _why(err: OSError, path: str) -> str:
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"the workspace is full (its quota of bytes or files): {path}"
    if err.errno == errno.ELOOP:
        return f"symlinks are not allowed: {path}"
    if err.errno == errno.ENXIO:
        return f"not a regular file: {path}"
    if err.errno == errno.ENOTDIR:
        return f"not a directory on the way to {path}"
    return f"{err.strerror or err}: {path}"


async def _write_file(ws: Workspace, args: dict[str, str]) -> str:
    return ws.write_file(args["path"], args["content"])


async def _read_file(ws: Workspace, args: dict[str, str]) -> str:
    return ws.read_file(args["path"])


async def _terminal(ws: Workspace, args: dict[str, str]) -> str:
    return await ws.terminal(args["command"])


async def _patch(ws: Workspace, args: dict[str, str]) -> str:
    return ws.patch(args["path"], args["old"], args["new"])


# The agent's tools; their names and descriptions are what the model reads (the fixture model was
# trained on them: rebuild it after editing).
TOOLS: Registry[Tool] = toolset([
    Tool("write_file", "Write a text file in the sandbox (replaces it).", (("path", "relative path"), ("content", "file content")), _write_file),
    Tool("read_file", "Read a text file of the sandbox.", (("path", "relative path"),), _read_file),
    Tool("terminal", "Run a shell command in the sandbox directory; returns its output and exit code.", (("command", "shell command"),), _terminal),
    Tool("patch", "Replace one exact occurrence of `old` with `new` in a file.", (("path", "relative path"), ("old", "text to find"), ("new", "replacement")), _patch),
])
