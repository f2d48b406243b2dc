"""Uid leases (opd.jail.uids) do not pile up: a released lease takes its lock file with it, also
when leases are taken and given back by many processes at once, a lease held by another process
is never taken, and a dead holder's lease is taken again (and its file then removed)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import ROOT, sandbox_limits
from opd.event_loop import run_loop
from opd.jail import uids as uid_leases
from opd.jail.uids import UidLease
from opd.tools.workspace import Workspace

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="uid leases need a root launcher")


def _in_a_process(directory: Path, code: str) -> str:
    """Python that runs with leases in `directory` (`take` and `UidLease` in scope)."""
    return textwrap.dedent(f"""
        import os, random, sys, time
        from pathlib import Path
        from opd.jail import uids
        from opd.jail.uids import UidLease
        uids._lock_dir = lambda: Path({str(directory)!r})
    """) + textwrap.dedent(code)


@pytest.mark.slow
def test_two_thousand_workspaces_leave_the_lease_directory_as_they_found_it(own_leases: tuple[Path, int]) -> None:
    directory, base = own_leases
    limits = sandbox_limits(uid_base=base)
    dead = str(base + 7)
    (directory / dead).touch()  # a dead holder's file, from before
    before = sorted(os.listdir(directory))
    taken: set[int] = set()

    async def open_and_close(count: int) -> None:
        for _ in range(count):
            workspace = Workspace(limits)
            taken.add(workspace.lease.uid)
            assert (directory / str(workspace.lease.uid)).is_file()
            await workspace.close()

    run_loop(open_and_close(2000))
    # The dead holder's file stays unless a workspace drew its uid (each draws one of 60,000 at
    # random: 2,000 do so about 3% of the time); that one reused the file and removed it in turn.
    expected = before if base + 7 not in taken else [name for name in before if name != dead]
    assert sorted(os.listdir(directory)) == expected


def test_leases_taken_and_given_back_by_four_processes_at_once_are_never_shared(own_leases: tuple[Path, int]) -> None:
    """Four processes take and release leases from three uids as fast as they can; while a process
    holds a uid it owns a marker file for it (made with O_EXCL: a second holder at the same moment
    would fail to make it). In the end no lease file is left."""
    directory, base = own_leases
    markers = directory.parent / "markers"
    markers.mkdir()
    code = _in_a_process(directory, f"""
        uids.UID_COUNT = 3
        taken = 0
        while taken < 300:
            try:
                lease = UidLease.take({base})
            except Exception as err:  # all three held by the others at this moment
                assert "are leased" in str(err), err
                continue
            marker = os.open(Path({str(markers)!r}) / str(lease.uid), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            os.close(marker)
            os.unlink(Path({str(markers)!r}) / str(lease.uid))
            lease.release()
            taken += 1
        print("ok")
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = [proc.communicate(timeout=120) for proc in procs]
    assert [out.strip() for out, _ in results] == ["ok"] * 4, [err[-2000:] for _, err in results]
    assert os.listdir(directory) == []


def test_a_lease_held_by_a_live_process_is_never_taken_and_a_dead_ones_is(own_leases: tuple[Path, int], monkeypatch: pytest.MonkeyPatch) -> None:
    directory, base = own_leases
    hold = _in_a_process(directory, f"""
        random.randrange = lambda n: 0
        lease = UidLease.take({base})
        print(lease.uid, flush=True)
        time.sleep(60)
    """)
    holder = subprocess.Popen([sys.executable, "-c", hold], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == str(base)
        monkeypatch.setattr(uid_leases.random, "randrange", lambda n: 0)  # every search starts at `base`
        mine = UidLease.take(base)
        assert mine.uid == base + 1  # passed over the live holder's
        mine.release()
        holder.kill()  # dies holding it: its file stays, unlocked
        holder.wait()
        assert os.listdir(directory) == [str(base)]
        again = UidLease.take(base)
        assert again.uid == base  # a dead holder's lease is taken again ...
        again.release()
        assert os.listdir(directory) == []  # ... and its file removed with it
    finally:
        holder.kill()
        holder.wait()
