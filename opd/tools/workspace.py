"""The coding agent's tools over one rollout's sandbox directory: write_file, read_file, terminal,
patch (`TOOLS`, run against a `Workspace` bound in a `Toolbox`).

File tools only touch regular files inside the directory: absolute paths, `..` components and
symlinks anywhere on the path are refused. `terminal` runs `bash -c` in the directory under the
sandbox limits (see `opd.tools.sandbox`). A refused or failed call raises `ToolError`, which the
toolbox turns into an error result for the model.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path, PurePosixPath

from opd.config import SandboxConfig
from opd.tools.registry import Tool, ToolError
from opd.tools.sandbox import run_command


class Workspace:
    """A fresh directory for one rollout; `close()` removes it."""

    def __init__(self, limits: SandboxConfig, max_file_chars: int = 20_000, parent: str | None = None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="opd-rollout-", dir=parent)).resolve()
        self.limits = limits
        self.max_file_chars = max_file_chars

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def resolve(self, path: str) -> Path:
        """The file's absolute path inside the root, or ToolError."""
        if not path.strip():
            raise ToolError("path must be a non-empty string")
        if "\x00" in path:
            raise ToolError("path contains a NUL byte")
        pure = PurePosixPath(path)
        if pure.is_absolute():
            raise ToolError(f"absolute paths are not allowed: {path}")
        if ".." in pure.parts:
            raise ToolError(f"'..' is not allowed in paths: {path}")
        current = self.root
        for part in pure.parts:
            current = current / part
            if current.is_symlink():
                raise ToolError(f"symlinks are not allowed: {path}")
        return current

    def write_file(self, path: str, content: str) -> str:
        if len(content) > self.max_file_chars:
            raise ToolError(f"content longer than {self.max_file_chars} characters")
        target = self.resolve(path)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            # O_NOFOLLOW: a symlink created between the check and the write is still refused.
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(content)
        except OSError as err:
            raise ToolError(str(err)) from None
        return f"wrote {len(content.encode())} bytes to {path}"

    def read_file(self, path: str) -> str:
        target = self.resolve(path)
        try:
            fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, encoding="utf-8", errors="replace") as handle:
                text = handle.read(self.max_file_chars + 1)
        except OSError as err:
            raise ToolError(str(err)) from None
        if len(text) > self.max_file_chars:
            return text[: self.max_file_chars] + f"\n...[truncated at {self.max_file_chars} characters]"
        return text

    def patch(self, path: str, old: str, new: str) -> str:
        if not old:
            raise ToolError("patch needs a non-empty `old`")
        current = self.read_file(path)
        count = current.count(old)
        if count != 1:
            raise ToolError(f"`old` occurs {count} times in {path}; it must occur exactly once")
        self.write_file(path, current.replace(old, new, 1))
        return f"patched {path}"

    async def terminal(self, command: str) -> str:
        if not command.strip():
            raise ToolError("command must be a non-empty string")
        result = await run_command(["/bin/bash", "-c", command], str(self.root), self.limits)
        output = result.stdout + result.stderr
        status = f"timed out after {self.limits.timeout_s:g} s" if result.timed_out else f"exit code {result.exit_code}"
        return f"{output}[{status}]"


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
TOOLS: list[Tool] = [
    Tool("write_file", "Write a text file in the sandbox (replaces it).", (("path", "relative path"), ("content", "file content")), _write_file),
    Tool("read_file", "Read a text file of the sandbox.", (("path", "relative path"),), _read_file),
    Tool("terminal", "Run a shell command in the sandbox directory; returns its output and exit code.", (("command", "shell command"),), _terminal),
    Tool("patch", "Replace one exact occurrence of `old` with `new` in a file.", (("path", "relative path"), ("old", "text to find"), ("new", "replacement")), _patch),
]
