"""A sandboxed call's memory and process limits hold for the whole call, not per process
(opd/jail/cgroups.py): a call that forks cannot multiply its memory, and a call without a
leased uid still has a process limit."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from conftest import sandbox_limits
from opd.jail import cgroups
from opd.jail.call_dirs import launcher_dirs
from opd.jail.sandbox import run_command, run_python

pytestmark = pytest.mark.skipif(not cgroups.available(), reason="needs root and the cgroup v1 memory and pids controllers")

# Four children, each touching 150 MiB and holding it: 600 MiB at once, each well under the
# per-process limit.
FAN_OUT = """
import os, sys, time
children = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        block = bytearray(150 * 1024 * 1024)
        for i in range(0, len(block), 4096):
            block[i] = 1
        time.sleep(1.5)  # held at once by every child that got it
        os._exit(0)
    children.append(pid)
print(sum(os.waitpid(pid, 0)[1] == 0 for pid in children), "children held 150 MiB")
"""


def test_forked_children_share_the_calls_memory_limit() -> None:
    result = asyncio.run(run_python(FAN_OUT, sandbox_limits(memory_mb=256, timeout_s=30)))
    held = int(result.stdout.split()[0]) if result.stdout.strip() else 0
    assert held <= 1, result  # 256 MiB for the whole call: at most one child can hold its 150 MiB
    # The same program with room for all four: the limit, not the program, stopped them.
    roomy = asyncio.run(run_python(FAN_OUT, sandbox_limits(memory_mb=1024, timeout_s=30)))
    assert roomy.stdout.startswith("4 children"), roomy


@pytest.mark.slow
def test_a_call_without_a_leased_uid_still_has_a_process_limit() -> None:
    """uid None (a launcher that is not root runs every call as itself): RLIMIT_NPROC cannot be
    the call's own, the group's pids.max is."""
    workdir = launcher_dirs().make("cg-", None)
    script = "for i in $(seq 40); do sleep 3 & done; echo started; wait"
    try:
        capped = asyncio.run(run_command(["/bin/sh", "-c", script], workdir, sandbox_limits(max_processes=16, timeout_s=20), None))
        roomy = asyncio.run(run_command(["/bin/sh", "-c", script], workdir, sandbox_limits(max_processes=64, timeout_s=20), None))
    finally:
        asyncio.run(launcher_dirs().remove(workdir))
    assert "Cannot fork" in capped.stderr and "started" not in capped.stdout, capped
    assert roomy.exit_code == 0 and "started" in roomy.stdout, roomy


def test_groups_are_removed_after_their_calls_and_a_dead_launchers_groups_by_the_next() -> None:
    mine = [d for c in cgroups.CONTROLLERS for d in cgroups.base(c).iterdir() if d.name.startswith(f"{os.getpid()}-")]
    assert mine == []  # every call above removed its groups
    # A group left by a launcher that is gone (a pid that cannot exist) goes at the next sweep.
    stale = [cgroups.base(c) / "4999999-0" for c in cgroups.CONTROLLERS]
    for directory in stale:
        directory.mkdir()
    cgroups._sweep()
    assert not any(Path(d).exists() for d in stale)
