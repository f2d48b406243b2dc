"""The coding agent's file and terminal tools: confined to the rollout's directory."""

from __future__ import annotations

import asyncio
import os

import pytest

from conftest import sandbox_limits
from opd.tools import workspace as workspace_tools
from opd.tools.registry import Toolbox, ToolError
from opd.tools.workspace import Workspace


@pytest.fixture
def workspace():
    ws = Workspace(sandbox_limits(timeout_s=5, output_chars=300), max_file_chars=1000)
    yield ws
    asyncio.run(ws.close())
    assert not ws.root.exists()


def test_write_read_patch(workspace: Workspace) -> None:
    assert workspace.write_file("pkg/mod.py", "x = 1\n") == "wrote 6 bytes to pkg/mod.py"
    assert workspace.read_file("pkg/mod.py") == "x = 1\n"
    assert workspace.patch("pkg/mod.py", "x = 1", "x = 2") == "patched pkg/mod.py"
    assert workspace.read_file("pkg/mod.py") == "x = 2\n"
    with pytest.raises(ToolError, match="occurs 0 times"):
        workspace.patch("pkg/mod.py", "y", "z")


@pytest.mark.parametrize("path", ["/etc/passwd", "../outside.txt", "a/../../outside.txt", "", "a\x00b"])
def test_paths_outside_are_refused(workspace: Workspace, path: str) -> None:
    with pytest.raises(ToolError):
        workspace.write_file(path, "x")
    with pytest.raises(ToolError):
        workspace.read_file(path)
    assert not os.path.exists(os.path.join(os.path.dirname(workspace.root), "outside.txt"))


def test_symlinks_are_refused_even_when_made_by_the_terminal(workspace: Workspace) -> None:
    out = asyncio.run(workspace.terminal("ln -s /etc etc_link && ln -s /etc/hostname host && echo made"))
    assert "made" in out
    for attempt in (lambda: workspace.read_file("etc_link/passwd"), lambda: workspace.read_file("host"), lambda: workspace.write_file("host", "pwned")):
        with pytest.raises(ToolError, match="symlinks are not allowed"):
            attempt()


def test_terminal_runs_in_the_workspace_with_exit_code_and_truncation(workspace: Workspace) -> None:
    workspace.write_file("a.txt", "hello")
    assert asyncio.run(workspace.terminal("cat a.txt; exit 3")) == "hello[exit code 3]"
    out = asyncio.run(workspace.terminal("python -c \"print('y' * 100000)\""))
    assert "truncated at 300" in out and out.endswith("[exit code 0]")


@pytest.mark.slow
def test_terminal_timeout_is_reported(workspace: Workspace) -> None:
    slow = Workspace(sandbox_limits(timeout_s=1))
    try:
        assert asyncio.run(slow.terminal("sleep 30")).endswith("[timed out after 1 s]")
    finally:
        asyncio.run(slow.close())


def test_the_toolbox_turns_bad_calls_into_results(workspace: Workspace) -> None:
    tools = Toolbox(workspace_tools.TOOLS, workspace)

    def run(name: str, arguments: dict):
        return asyncio.run(tools.run(name, arguments))

    missing = run("write_file", {"path": "a.py"})
    assert (missing.status, missing.ran, missing.as_text()) == ("malformed", False, 'error: write_file needs a "content" string')
    assert run("terminal", {"command": 3}).status == "malformed"
    # A NUL byte cannot be in an argv: an error result, not a ValueError out of the tool (a fuzz find).
    for command in ("\x00", "echo a\x00b"):
        nul = run("terminal", {"command": command})
        assert (nul.status, nul.as_text()) == ("error", "error: command contains a NUL byte")
    unknown = run("rm_rf", {})
    assert unknown.status == "malformed" and unknown.as_text() == "error: unknown tool 'rm_rf'; available: write_file, read_file, terminal, patch"
    too_big = run("write_file", {"path": "big.txt", "content": "x" * 2000})
    assert (too_big.status, too_big.ran, too_big.as_text()) == ("error", True, "error: content longer than 1000 characters")
    ok = run("write_file", {"path": "a.py", "content": "x = 1\n"})
    assert (ok.status, ok.as_text()) == ("ok", "wrote 6 bytes to a.py")
    assert run("terminal", {"command": "exit 4"}).as_text() == "[exit code 4]"  # a failing command is a result, not a tool error
