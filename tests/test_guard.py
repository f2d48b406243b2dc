"""The server guard: a launcher killed with SIGKILL takes its server's whole process group down."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from conftest import ROOT

GUARD = ROOT / "opd" / "serving" / "guard.py"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as handle:  # a zombie waiting for its reaper is dead too
        return handle.read().split(") ", 1)[1][0] != "Z"


def _launcher(tmp_path: Path) -> tuple[subprocess.Popen, list[int]]:
    """A stand-in launcher that starts a 'server' (which spawns an 'engine') through the guard."""
    pids = tmp_path / "pids"
    server = f"import subprocess, time; e = subprocess.Popen(['sleep', '300']); open({str(pids)!r}, 'w').write(str(e.pid)); time.sleep(300)"
    launcher = textwrap.dedent(f"""
        import subprocess, sys, time
        subprocess.Popen([sys.executable, {str(GUARD)!r}, sys.executable, "-c", {server!r}], start_new_session=True)
        time.sleep(300)
    """)
    proc = subprocess.Popen([sys.executable, "-c", launcher])
    deadline = time.monotonic() + 20
    while not pids.exists() or not pids.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    return proc, [int(pids.read_text())]


def test_a_killed_launcher_takes_the_server_and_its_children_down(tmp_path: Path) -> None:
    launcher, (engine,) = _launcher(tmp_path)
    assert _alive(engine)
    launcher.kill()
    launcher.wait()
    deadline = time.monotonic() + 10
    while _alive(engine):
        assert time.monotonic() < deadline, "the engine outlived its launcher"
        time.sleep(0.2)


def test_the_guard_passes_sigterm_on_and_returns_the_exit_code(tmp_path: Path) -> None:
    code = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(7)); print('up', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, str(GUARD), sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout.readline().strip() == "up"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 7
