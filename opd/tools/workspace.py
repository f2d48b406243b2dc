"""The coding agent's tools over one rollout's sandbox directory.

File tools only touch regular files inside the directory: absolute paths, `..` components and
symlinks anywhere on the path are refused. `terminal` runs `bash -c` in the directory under the
sandbox limits (see `opd.tools.sandbox`). Every result is text for the model; failures are
`error: ...` results, never exceptions.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

from opd.tools.sandbox import SandboxLimits, run_command


class PathError(ValueError):
    """A path the file tools refuse; the message says why."""


class Workspace:
    """A fresh directory for one rollout; `close()` removes it."""

    def __init__(self, limits: SandboxLimits, max_file_chars: int = 20_000, parent: str | None = None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="opd-rollout-", dir=parent)).resolve()
        self.limits = limits
        self.max_file_chars = max_file_chars

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def resolve(self, path: Any) -> Path:
        """The file's absolute path inside the root, or PathError."""
        if not isinstance(path, str) or not path.strip():
            raise PathError("path must be a non-empty string")
        if "\x00" in path:
            raise PathError("path contains a NUL byte")
        pure = PurePosixPath(path)
        if pure.is_absolute():
            raise PathError(f"absolute paths are not allowed: {path}")
        if ".." in pure.parts:
            raise PathError(f"'..' is not allowed in paths: {path}")
        current = self.root
        for part in pure.parts:
            current = current / part
            if current.is_symlink():
                raise PathError(f"symlinks are not allowed: {path}")
        return current

    def write_file(self, path: Any, content: Any) -> str:
        if not isinstance(content, str):
            return "error: content must be a string"
        if len(content) > self.max_file_chars:
            return f"error: content longer than {self.max_file_chars} characters"
        try:
            target = self.resolve(path)
            target.parent.mkdir(parents=True, exist_ok=True)
            # O_NOFOLLOW: a symlink created between the check and the write is still refused.
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(content)
        except (PathError, OSError) as err:
            return f"error: {err}"
        return f"wrote {len(content.encode())} bytes to {path}"

    def read_file(self, path: Any) -> str:
        try:
            target = self.resolve(path)
            fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, encoding="utf-8", errors="replace") as handle:
                text = handle.read(self.max_file_chars + 1)
        except (PathError, OSError) as err:
            return f"error: {err}"
        if len(text) > self.max_file_chars:
            return text[: self.max_file_chars] + f"\n...[truncated at {self.max_file_chars} characters]"
        return text

    def patch(self, path: Any, old: Any, new: Any) -> str:
        if not isinstance(old, str) or not isinstance(new, str) or not old:
            return "error: patch needs non-empty `old` and string `new`"
        current = self.read_file(path)
        if current.startswith("error:"):
            return current
        count = current.count(old)
        if count != 1:
            return f"error: `old` occurs {count} times in {path}; it must occur exactly once"
        result = self.write_file(path, current.replace(old, new, 1))
        return result if result.startswith("error:") else f"patched {path}"

    async def terminal(self, command: Any) -> str:
        if not isinstance(command, str) or not command.strip():
            return "error: command must be a non-empty string"
        result = await run_command(["/bin/bash", "-c", command], str(self.root), self.limits)
        output = result.stdout + result.stderr
        status = f"timed out after {self.limits.timeout_s:g} s" if result.timed_out else f"exit code {result.exit_code}"
        return f"{output}[{status}]"

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        """Dispatch one tool call by name."""
        if name == "write_file":
            return self.write_file(arguments.get("path"), arguments.get("content"))
        if name == "read_file":
            return self.read_file(arguments.get("path"))
        if name == "patch":
            return self.patch(arguments.get("path"), arguments.get("old"), arguments.get("new"))
        if name == "terminal":
            return await self.terminal(arguments.get("command"))
        return f"error: unknown tool {name!r}; available: write_file, read_file, terminal, patch"
