"""A corpus of hostile programs: each is contained and reported as a failed tool call, nothing it
started survives the call, the launcher (this process) is untouched, and the next call works.

Every program runs twice: as the python tool's code (inline_math) and as a file the coding agent
runs from its terminal (opd_coding).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from pathlib import Path

import pytest

from conftest import ROOT, sandbox_limits
from opd.tools.sandbox import _pids_cgroup_root, remove_stale_cgroups, run_python, sandbox_plan
from opd.tools import workspace as workspace_tools
from opd.tools.registry import Toolbox
from opd.tools.workspace import Workspace

LIMITS = sandbox_limits(timeout_s=3, cpu_s=3, memory_mb=512, file_size_mb=8, max_processes=16, output_chars=500)
ESCAPE = ROOT / "opd-hostile-escape.txt"
SECRET = "opd-hostile-secret-7f3a"
LAUNCHER = os.getpid()
DROPS_ROOT = sandbox_plan(LIMITS.user)[0] is not None

# name -> program. {pid} is this process (the launcher), {escape} a path outside the sandbox.
CORPUS = {
    "infinite_loop": "while True:\n    pass\n",
    "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
    "memory_bomb": "block = bytearray(8 * 1024 ** 3)\n",
    "disk_filler": "with open('filler.bin', 'wb') as f:\n    while True:\n        f.write(b'0' * 2 ** 20)\n",
    "gigantic_output": "import sys\nwhile True:\n    sys.stdout.write('x' * 2 ** 20)\n",
    "write_outside_absolute": "open({escape!r}, 'w').write('escaped')\n",
    "write_outside_dotdot": "import os\nopen(os.path.join('..', '..', {escape!r}.lstrip('/')), 'w').write('escaped')\n",
    "symlink_out": "import os\nos.symlink({escape!r}, 'link')\nopen('link', 'w').write('escaped')\n",
    "read_parent_environment": "import os\nprint(open('/proc/{pid}/environ', 'rb').read())\n",
    "print_the_environment": "import os\nprint(dict(os.environ))\nraise SystemExit(4)\n",
    "kill_the_launcher": "import os, signal\nos.kill({pid}, signal.SIGKILL)\n",
    "network": "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)\n",
    "background_process": "import subprocess\nsubprocess.Popen(['sleep', '987'], start_new_session=True)\nraise SystemExit(5)\n",
    "sleep_past_timeout": "import time\ntime.sleep(600)\n",
}
# Needs root-only protections (privilege drop) to be an error; a non-root launcher reports them
# as errors anyway because the kernel refuses the same things to any unprivileged user.
ROOT_ONLY = {"write_outside_absolute", "write_outside_dotdot", "symlink_out", "read_parent_environment"}


def program(name: str) -> str:
    return CORPUS[name].format(pid=LAUNCHER, escape=str(ESCAPE), secret=SECRET)


def _leftovers() -> list[str]:
    """Processes the corpus may have left: `sleep 987` and anything of a sandbox cgroup."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "sleep 987" in cmdline:
                found.append(f"{entry.name}: {cmdline}")
    root = _pids_cgroup_root()
    if root is not None:
        remove_stale_cgroups()
        for group in root.glob("opd-sandbox-*"):
            with contextlib.suppress(OSError):
                if (group / "cgroup.procs").read_text().split():
                    found.append(f"{group}: {(group / 'cgroup.procs').read_text().split()}")
    return found


@pytest.fixture(autouse=True)
def _secret_and_cleanup(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OPD_HOSTILE_SECRET", SECRET)
    ESCAPE.unlink(missing_ok=True)
    yield
    assert not ESCAPE.exists(), "a program wrote outside its sandbox"
    assert _leftovers() == [], "a program left processes behind"


def _check_skip(name: str) -> None:
    if name == "fork_bomb" and _pids_cgroup_root() is None and os.geteuid() == 0:
        pytest.skip("no pids cgroup and running as root: Linux would not limit a fork bomb (README, Guarantees)")
    if name in ROOT_ONLY and os.geteuid() == 0 and not DROPS_ROOT:
        pytest.skip("running as root without a sandbox user: the code could do this (README, Guarantees)")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CORPUS))
def test_python_tool_contains_and_reports(name: str) -> None:
    _check_skip(name)
    result = asyncio.run(run_python(program(name), LIMITS))
    assert result.error is not None, (name, result)
    assert SECRET not in result.stdout + result.stderr
    assert len(result.stdout) <= LIMITS.output_chars + 60 and len(result.stderr) <= LIMITS.output_chars + 60
    assert result.wall_s < LIMITS.timeout_s + 5
    assert asyncio.run(run_python("1 + 1", LIMITS)).stdout.strip() == "2"  # the next call works


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CORPUS))
def test_agent_terminal_contains_and_reports(name: str) -> None:
    _check_skip(name)
    workspace = Workspace(LIMITS, max_file_chars=5000)
    tools = Toolbox(workspace_tools.TOOLS, workspace)

    def call(tool: str, **arguments: str) -> str:
        return asyncio.run(tools.run(tool, arguments)).as_text()

    try:
        assert call("write_file", path="evil.py", content=program(name)).startswith("wrote")
        output = call("terminal", command="python evil.py")
        status = re.search(r"\[(exit code (-?\d+)|timed out after [\d.]+ s)\]$", output)
        assert status is not None, output[-300:]
        assert status.group(2) != "0", output[-300:]
        assert len(output) <= 2 * LIMITS.output_chars + 200
        assert SECRET not in output
        assert call("terminal", command="echo fine") == "fine\n[exit code 0]"
    finally:
        workspace.close()


# ---------------------------------------------------------------- untrusted text

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from opd.agent.tool_calls import ToolCallError, last_open_call, parse_tool_call  # noqa: E402
from opd.distill.judge_prompt import parse_vote  # noqa: E402
from opd.rewards.boxed import boxed_contents, final_answer  # noqa: E402
from opd.tools.calculator import CalculatorError, evaluate  # noqa: E402

PARSERS = {
    "tool_call": (parse_tool_call, ToolCallError),
    "last_open_call": (last_open_call, ()),
    "judge_vote": (parse_vote, ()),
    "boxed": (boxed_contents, ()),
    "final_answer": (final_answer, ()),
    "calculator": (evaluate, CalculatorError),
}
PATHOLOGICAL = {
    "deep_json": '{"name": "calculator", "arguments": ' + "[" * 200_000 + "]" * 200_000 + "}",
    "open_braces": "{" * 100_000,
    "nested_boxes": "\\boxed{" * 50_000,
    "deep_parens": "(" * 100_000 + "1" + ")" * 100_000,
    "power_tower": "9**9**9**9**9",
    "unary_chain": "-" * 100_000 + "1",
    "huge_box": "</think>\\boxed{" + "a" * 1_000_000 + "}",
    "many_tool_tags": "<tool_call>" * 100_000,
    "many_verdicts": "\\boxed{1}" * 100_000,
}


@pytest.mark.parametrize("text_name", sorted(PATHOLOGICAL))
@pytest.mark.parametrize("parser_name", sorted(PARSERS))
def test_parsers_survive_pathological_text_quickly(parser_name: str, text_name: str) -> None:
    parse, allowed = PARSERS[parser_name]
    started = time.monotonic()
    try:
        parse(PATHOLOGICAL[text_name])
    except allowed:  # the documented, clean refusal
        pass
    assert time.monotonic() - started < 0.5


ADVERSARIAL = st.lists(st.sampled_from(["{", "}", "[", "]", '"', "\\", "\\boxed", "<tool_call>", "</tool_call>", "</think>", "**", "(", ")", "9", ":", ",", "name", "arguments", "\n", "\\boxed{1}", "\\boxed{-1}"]), max_size=3000).map("".join)


@settings(max_examples=150, deadline=None)
@given(ADVERSARIAL)
def test_parsers_never_raise_on_adversarial_token_soup(text: str) -> None:
    for parse, allowed in PARSERS.values():
        try:
            parse(text)
        except allowed:
            pass


def test_a_cancelled_call_leaves_nothing_running() -> None:
    # A run that ends (server lost, Ctrl-C) cancels its rollouts in the middle of tool calls.
    code = "import subprocess, time\nsubprocess.Popen(['sleep', '987'], start_new_session=True)\ntime.sleep(600)\n"

    async def cancel_midway() -> None:
        task = asyncio.create_task(run_python(code, LIMITS))
        await asyncio.sleep(1.0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(cancel_midway())
    deadline = time.monotonic() + 5
    while _leftovers() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _leftovers() == []
