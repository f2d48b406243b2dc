"""The coding agent's file and terminal tools: confined to the rollout's directory."""

from __future__ import annotations

import asyncio
import os

import pytest

from opd.tools.sandbox import SandboxLimits
from opd.tools.workspace import Workspace


@pytest.fixture
def workspace():
    ws = Workspace(SandboxLimits(timeout_s=5, output_chars=300), max_file_chars=1000)
    yield ws
    ws.close()
    assert not ws.root.exists()


def test_write_read_patch(workspace: Workspace) -> None:
    assert workspace.write_file("pkg/mod.py", "x = 1\n") == "wrote 6 bytes to pkg/mod.py"
    assert workspace.read_file("pkg/mod.py") == "x = 1\n"
    assert workspace.patch("pkg/mod.py", "x = 1", "x = 2") == "patched pkg/mod.py"
    assert workspace.read_file("pkg/mod.py") == "x = 2\n"
    assert "occurs 0 times" in workspace.patch("pkg/mod.py", "y", "z")


@pytest.mark.parametrize("path", ["/etc/passwd", "../outside.txt", "a/../../outside.txt", "", "a\x00b"])
def test_paths_outside_are_refused(workspace: Workspace, path: str) -> None:
    assert workspace.write_file(path, "x").startswith("error:")
    assert workspace.read_file(path).startswith("error:")
    assert not os.path.exists(os.path.join(os.path.dirname(workspace.root), "outside.txt"))


def test_symlinks_are_refused_even_when_made_by_the_terminal(workspace: Workspace) -> None:
    out = asyncio.run(workspace.terminal("ln -s /etc etc_link && ln -s /etc/hostname host && echo made"))
    assert "made" in out
    assert "symlinks are not allowed" in workspace.read_file("etc_link/passwd")
    assert "symlinks are not allowed" in workspace.read_file("host")
    assert "symlinks are not allowed" in workspace.write_file("host", "pwned")


def test_terminal_runs_in_the_workspace_with_exit_code_and_truncation(workspace: Workspace) -> None:
    workspace.write_file("a.txt", "hello")
    assert asyncio.run(workspace.terminal("cat a.txt; exit 3")) == "hello[exit code 3]"
    out = asyncio.run(workspace.terminal("python -c \"print('y' * 100000)\""))
    assert "truncated at 300" in out and out.endswith("[exit code 0]")


def test_terminal_timeout_is_reported(workspace: Workspace) -> None:
    slow = Workspace(SandboxLimits(timeout_s=1))
    try:
        assert asyncio.run(slow.terminal("sleep 30")).endswith("[timed out after 1 s]")
    finally:
        slow.close()


def test_bad_arguments_are_error_results(workspace: Workspace) -> None:
    assert asyncio.run(workspace.call("write_file", {"path": "a.py"})).startswith("error:")
    assert asyncio.run(workspace.call("terminal", {})).startswith("error:")
    assert asyncio.run(workspace.call("rm_rf", {})).startswith("error: unknown tool")
    assert workspace.write_file("big.txt", "x" * 2000).startswith("error: content longer")
