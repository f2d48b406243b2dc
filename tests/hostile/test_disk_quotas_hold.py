"""No call writes past its disk quota, in bytes or in files, while it runs (a tmpfs per place, as
root); without a tmpfs the workspace is measured and emptied; deep chains, long paths and many
files are counted and removed off the event loop; a killed launcher's mounts are swept
(docs/guarantees.md, "Sandbox", "Disk")."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import pytest

from conftest import sandbox_limits
from hostile.common import LIMITS, AS_ROOT, call, workspace, GOOD
from stalls import STALL_LIMIT_S, Stalls, measure
from opd.jail import tmpfs
from opd.jail.call_dirs import CallDirs
from opd.jail.sandbox import run_python
from opd.rewards.harness import run_tests
from opd.tools.workspace import Workspace

# The leftover check (hostile/conftest.py) scans the whole machine: these tests run on one xdist worker.
pytestmark = pytest.mark.xdist_group("hostile")

@pytest.fixture
def without_tmpfs(monkeypatch: pytest.MonkeyPatch) -> None:
    """As a launcher that may not mount (not root): workspaces measured after each call."""
    monkeypatch.setattr(tmpfs, "available", lambda: False)


def test_without_a_tmpfs_a_workspace_over_its_quota_is_emptied_and_closed(without_tmpfs: None) -> None:
    with workspace(sandbox_limits(timeout_s=10, workspace_mb=4, file_size_mb=2)) as (ws, tools):
        call(tools, "write_file", path="solution.py", content=GOOD)
        output = call(tools, "terminal", command="for i in 1 2 3 4; do head -c 1500000 /dev/zero > f$i; done; echo done")
        assert "over its 4 MiB quota" in output and asyncio.run(ws.used_mb()) == 0
        assert "quota" in call(tools, "read_file", path="solution.py")
        assert "quota" in call(tools, "terminal", command="echo again")


def test_a_chain_of_directories_thousands_deep_is_measured_and_removed() -> None:
    # Deeper than Python's recursion limit: a recursive walk or rmtree raised out of the call,
    # kept the uid leased, and left a directory every later launcher failed to sweep.
    with workspace() as (ws, tools):
        chain = "python -c \"import os\nfor i in range(1500):\n    os.mkdir('d')\n    os.chdir('d')\nopen('f', 'w').write('x')\""
        assert call(tools, "terminal", command=chain) == "[exit code 0]"
        assert "deeper than 32 directories" in call(tools, "write_file", path="d/" * 1500 + "f", content="x")  # the file tools' own cap
        assert call(tools, "terminal", command="echo next") == "next\n[exit code 0]"
        root, lease = ws.root, ws.lease
    assert not root.exists() and lease._fd is None
    build = "import os\nfor i in range(1500):\n    os.mkdir('d')\n    os.chdir('d')\nprint('built')\n"
    result = asyncio.run(run_python(build, LIMITS))
    assert result.stdout == "built\n" and result.error is None


@pytest.mark.parametrize("mounted", [True, False], ids=["tmpfs", "measured"])
def test_files_under_paths_longer_than_path_max_count_against_the_quota(mounted: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not mounted:
        monkeypatch.setattr(tmpfs, "available", lambda: False)
    name = "n" * 250  # 20 of them: a path of 5,000 characters
    hide = f"for i in $(seq 20); do mkdir {name} && cd {name}; done; head -c 3000000 /dev/zero > a; head -c 3000000 /dev/zero > b; echo stored"
    with workspace(sandbox_limits(timeout_s=10, workspace_mb=4, file_size_mb=4)) as (ws, tools):
        output = call(tools, "terminal", command=hide)
        assert "stored" in output, output
        if ws_mounted := ws.dirs.is_tmpfs(ws.root):  # the second file never fit
            assert "the workspace is full (quota: 4 MiB)" in output and asyncio.run(ws.used_mb()) <= 4, output
        else:
            assert "over its 4 MiB quota" in output and asyncio.run(ws.used_mb()) == 0, output
        assert ws_mounted == (mounted and os.geteuid() == 0)


@pytest.mark.slow
@pytest.mark.parametrize("mounted", [True, False], ids=["tmpfs", "measured"])
def test_many_files_never_stall_the_event_loop(mounted: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # Measuring and removing 150,000 files took ~0.4 s and ~1.2 s on the event loop (du and rm);
    # unmounting a tmpfs that holds them frees them on a thread.
    if not mounted:
        monkeypatch.setattr(tmpfs, "available", lambda: False)
    make = "python -c \"import os\nfor d in range(150):\n os.mkdir(str(d))\n for i in range(1000):\n  os.close(os.open(f'{d}/{i}', os.O_CREAT | os.O_WRONLY))\""
    ws = Workspace(sandbox_limits(timeout_s=180, cpu_s=120, workspace_files=200_000))
    stalls = Stalls()
    try:
        assert measure(stalls, "make", lambda: ws.terminal(make)).endswith("[exit code 0]")
        assert measure(stalls, "echo", lambda: ws.terminal("echo hi")) == "hi\n[exit code 0]"  # measures them all
        measure(stalls, "close", ws.close)  # removes them all
    finally:
        if ws.lease._fd is not None:
            asyncio.run(ws.close())
    assert stalls.cpu_s < STALL_LIMIT_S, stalls.report("150,000 files")
    assert not ws.root.exists()


# Each attack writes as much as it can and reports how much it managed: the bound holds during
# the call, not only when it is measured afterwards.

DISK = sandbox_limits(timeout_s=20, cpu_s=15, file_size_mb=4, tmp_mb=8, tmp_files=500, workspace_mb=8, workspace_files=500)
# Writes 1 MiB files until a write fails (or 64 MiB), then prints the MiB written.
FILL_BYTES = ("import os\nn = 0\nfor i in range(64):\n    try:\n        with open(os.path.join(D, f'f{i}'), 'wb') as f:\n            f.write(b'0' * 2**20)\n"
              "        n += 1\n    except OSError:\n        break\nprint('MiB', n)\n")
# Makes empty files until it cannot (or 5,000), then prints how many it made.
FILL_FILES = ("import os\nn = 0\nfor i in range(5000):\n    try:\n        os.close(os.open(os.path.join(D, f'e{i}'), os.O_CREAT | os.O_WRONLY))\n"
              "        n += 1\n    except OSError:\n        break\nprint('files', n)\n")


def _written(output: str, what: str) -> int:
    found = re.search(rf"{what} (\d+)", output)
    assert found is not None, output[-500:]
    return int(found.group(1))


@AS_ROOT
@pytest.mark.parametrize("where", [".", "/tmp", "/dev/shm"])
def test_a_terminal_call_cannot_write_past_its_quota_while_it_runs(where: str) -> None:
    with workspace(DISK) as (ws, tools):
        call(tools, "write_file", path="fill_bytes.py", content=f"D = {where!r}\n" + FILL_BYTES)
        call(tools, "write_file", path="fill_files.py", content=f"D = {where!r}\n" + FILL_FILES)
        output = call(tools, "terminal", command="python fill_bytes.py")
        assert _written(output, "MiB") <= DISK.workspace_mb, output[-300:]
        if where == ".":
            assert "the workspace is full" in output and f"{DISK.workspace_mb} MiB" in output, output[-300:]
            call(tools, "terminal", command="rm -f f[0-9]*")  # room again: the workspace stays usable
        output = call(tools, "terminal", command="python fill_files.py")
        assert _written(output, "files") <= max(DISK.tmp_files, DISK.workspace_files), output[-300:]
        if where == ".":
            assert "the workspace is full" in output and f"{DISK.workspace_files} files" in output, output[-300:]
            assert "the workspace is full" in call(tools, "write_file", path="one_more.py", content="x")  # the file tools hit the same cap
        assert call(tools, "terminal", command="echo ok").startswith("ok\n")


@AS_ROOT
@pytest.mark.parametrize(("fill", "what", "limit"), [(FILL_BYTES, "MiB", DISK.tmp_mb), (FILL_FILES, "files", DISK.tmp_files)])
@pytest.mark.parametrize("where", [".", "/tmp"])
def test_a_python_call_cannot_write_past_its_quota_while_it_runs(fill: str, what: str, limit: int, where: str) -> None:
    result = asyncio.run(run_python(f"D = {where!r}\n" + fill, DISK))
    assert _written(result.stdout, what) <= limit, result
    assert result.error is not None and "full" in result.error and f"{limit} {'MiB' if what == 'MiB' else 'files'}" in result.error, result


@AS_ROOT
def test_the_rewards_test_run_cannot_write_past_its_quota() -> None:
    counted = ("import os\nBYTES = FILES = 0\nfor i in range(64):\n    try:\n        with open(f'f{i}', 'wb') as f:\n            f.write(b'0' * 2**20)\n"
               "        BYTES += 1\n    except OSError:\n        break\nfor i in range(5000):\n    try:\n        os.close(os.open(f'e{i}', os.O_CREAT | os.O_WRONLY))\n"
               "        FILES += 1\n    except OSError:\n        break\ndef written():\n    return [BYTES, FILES]\n")
    tests = f"from solution import written\nb, f = written()\nassert b <= {DISK.tmp_mb} and f <= {DISK.tmp_files}, (b, f)\n"
    outcome = asyncio.run(run_tests(counted, tests, DISK))
    assert outcome.level == "pass", outcome


@AS_ROOT
def test_a_killed_launchers_tmpfs_mounts_are_unmounted_and_swept() -> None:
    import subprocess
    import sys

    code = ("import asyncio\nfrom conftest import sandbox_limits\nfrom opd.tools.workspace import Workspace\n"
            "ws = Workspace(sandbox_limits(workspace_mb=4))\nws.write_file('a.txt', 'x' * 1000)\nprint(ws.root, flush=True)\n"
            "import time; time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=Path(__file__).parent.parent, stdout=subprocess.PIPE, text=True)
    try:
        workspace_root = Path(proc.stdout.readline().strip())
        assert tmpfs.mounts_under(workspace_root) == [workspace_root] and (workspace_root / "a.txt").exists()
    finally:
        proc.kill()
        proc.wait()
    CallDirs(workspace_root.parent.parent).sweeper.join(30)  # sweeps the killed launcher's directory on a thread
    assert tmpfs.mounts_under(workspace_root.parent) == [] and not workspace_root.parent.exists()
