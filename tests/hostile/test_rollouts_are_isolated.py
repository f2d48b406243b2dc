"""Rollouts are isolated from one another and from the machine: another rollout's files, processes
and memory out of reach (uids of their own), no privileged walk over paths the code controls
(symlink swaps), no FIFO that blocks, the jail's own /proc, /tmp and /dev/shm, nothing else
writable, no weaker jail than bubblewrap (docs/guarantees.md, "Sandbox")."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import stat
import time
from pathlib import Path

import pytest

from conftest import compose, sandbox_limits
from hostile.common import LIMITS, SECRET, AS_ROOT, call, workspace, TESTS, GOOD
from opd.config import validate
from opd.jail import reaping
from opd.jail.sandbox import run_python
from opd.rewards.coding import run_task_tests
from opd.rewards.harness import run_tests

# The leftover check (hostile/conftest.py) scans the whole machine: these tests run on one xdist worker.
pytestmark = pytest.mark.xdist_group("hostile")

# ---- rollouts are isolated from one another ---------------------------------------------


def test_a_rollout_cannot_reach_another_rollouts_files_processes_or_memory() -> None:
    with workspace() as (victim, victim_tools), workspace() as (attacker, attacker_tools):
        call(victim_tools, "write_file", path="test_solution.py", content=f"# {SECRET}\nassert True\n")

        async def both() -> tuple[str, str]:
            # The victim runs a process holding the secret in its memory and environment.
            holding = asyncio.create_task(victim.terminal(f"export SECRET_VAR={SECRET}; python -c \"import time; s = '{SECRET}' * 3; time.sleep(3)\""))
            await asyncio.sleep(1.0)
            probe = (
                f"cat {victim.root}/test_solution.py; echo tamper > {victim.root}/test_solution.py; ls {victim.root}; "
                "ls /proc | grep -E '^[0-9]+$' | wc -l; "
                # (the pattern's last character in brackets: grep's own argv does not match it)
                "for p in /proc/[0-9]*; do cat $p/environ $p/cmdline 2>/dev/null; head -c 100000 $p/mem 2>/dev/null; done "
                f"| grep -c '{SECRET[:-1]}[{SECRET[-1]}]'; "
                "ls /tmp; ls " + str(victim.root.parent)
            )
            seen = await attacker.terminal(probe)
            return seen, await holding

        seen, held = asyncio.run(both())
        assert SECRET not in seen, seen
        assert "exit code 0" in held  # the victim ran undisturbed
        assert call(victim_tools, "read_file", path="test_solution.py").startswith(f"# {SECRET}")  # not overwritten
        processes, matches = seen.splitlines()[:2]
        assert int(processes) <= 6 and matches == "0"  # it sees only its own processes, and no secret in them


@AS_ROOT
def test_rollouts_run_as_different_uids_and_own_their_files() -> None:
    with workspace() as (one, one_tools), workspace() as (two, two_tools):
        assert one.lease.uid != two.lease.uid
        call(one_tools, "write_file", path="a/b.py", content="x = 1\n")
        assert (one.root / "a").stat().st_uid == one.lease.uid and (one.root / "a" / "b.py").stat().st_uid == one.lease.uid
        assert stat.S_IMODE(one.root.stat().st_mode) == 0o700 and one.root.stat().st_uid == one.lease.uid
        assert call(one_tools, "terminal", command="id -u").startswith(str(one.lease.uid))


@pytest.mark.slow
def test_process_groups_are_signalled_only_while_their_leader_is_unreaped(monkeypatch: pytest.MonkeyPatch) -> None:
    # A reaped leader's pid is free: another rollout's jail (a session leader) may hold it already.
    # A jail's namespace (a root launcher's) is killed through a pidfd of the leader's child, while
    # that leader is unreaped.
    signalled: list[tuple[str, int, bool]] = []
    real_killpg, real_pidfd_send_signal = os.killpg, signal.pidfd_send_signal

    def unreaped(pid: int) -> bool:
        try:
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            return True
        except ChildProcessError:  # not an unreaped child of ours
            return False

    def checked_killpg(pgid: int, sig: int) -> None:
        # A group is killed only where the leader has no child left (its namespace ending meanwhile:
        # `reaping._kill`'s fallback); with a child, it is "group+child", a defect under a root launcher.
        child = reaping._child_of(pgid)
        if child is not None:
            os.close(child)
        signalled.append(("group" if child is None else "group+child", pgid, unreaped(pgid)))
        if not signalled[-1][2]:
            raise ProcessLookupError(pgid)
        real_killpg(pgid, sig)

    def checked_pidfd_send_signal(fd: int, sig: int, *args: object) -> None:
        pid = int(re.search(r"^Pid:\s*(-?\d+)", Path(f"/proc/self/fdinfo/{fd}").read_text(), re.M).group(1))
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        parent = int(stat[stat.rindex(b")") + 2:].split()[1])
        signalled.append(("child", parent, unreaped(parent)))
        if not signalled[-1][2]:
            raise ProcessLookupError(pid)
        real_pidfd_send_signal(fd, sig, *args)

    monkeypatch.setattr(os, "killpg", checked_killpg)
    monkeypatch.setattr(signal, "pidfd_send_signal", checked_pidfd_send_signal)
    # Its children keep the solution's jail busy after the tests' jail has ended.
    forking = "import os, time\nfor i in range(5):\n    if os.fork() == 0:\n        time.sleep(60)\n        os._exit(0)\n" + GOOD
    assert asyncio.run(run_tests(forking, TESTS, LIMITS)).level == "pass"
    with workspace() as (_, tools):
        assert call(tools, "terminal", command="echo fine") == "fine\n[exit code 0]"
    assert asyncio.run(run_python("import time\ntime.sleep(60)", LIMITS)).timed_out
    # The solution's jail and the timed-out call were killed; the ended calls were not signalled.
    assert len(signalled) >= 2 and all(ok for _, _, ok in signalled), signalled
    if os.geteuid() == 0:  # each jail in a namespace of its own: its first process killed, not the group
        kinds = [kind for kind, _, _ in signalled]
        assert "group+child" not in kinds and kinds[-1] == "child", signalled  # the timed-out call's child runs


@pytest.mark.slow
def test_symlink_swaps_while_the_file_tools_run_never_reach_outside(tmp_path: Path) -> None:
    target = tmp_path / "root-only.txt"
    target.write_text("untouched")
    target.chmod(0o600)
    before = target.stat()
    swapper = (
        f"for i in $(seq 1 2000); do mkdir -p d; rm -rf d; ln -s {tmp_path} d; rm -f d; mkdir d; "
        f"ln -sf {target} f.txt; rm -f f.txt; mkfifo f.txt; rm -f f.txt; done"
    )
    with workspace(sandbox_limits(timeout_s=8, cpu_s=8)) as (ws, tools):

        async def race() -> list[str]:
            swapping = asyncio.create_task(ws.terminal(swapper))
            results = []
            while not swapping.done():
                for name, arguments in (("write_file", {"path": "d/root-only.txt", "content": "pwned"}), ("write_file", {"path": "f.txt", "content": "pwned"}),
                                        ("read_file", {"path": "d/root-only.txt"}), ("read_file", {"path": "f.txt"}),
                                        ("patch", {"path": "f.txt", "old": "untouched", "new": "pwned"})):
                    results.append((await tools.run(name, arguments)).as_text())
                await asyncio.sleep(0)
            await swapping
            return results

        results = asyncio.run(race())
    after = target.stat()
    assert target.read_text() == "untouched" and (after.st_uid, after.st_gid, after.st_mode) == (before.st_uid, before.st_gid, before.st_mode)
    assert not any("untouched" in r for r in results)  # never read through a link
    assert len(results) > 20


def test_a_fifo_never_blocks_the_file_tools_or_the_reward() -> None:
    with workspace() as (ws, tools):
        assert "exit code 0" in call(tools, "terminal", command="mkfifo pipe && mkfifo solution.py && python -c \"import socket; s = socket.socket(socket.AF_UNIX); s.bind('sock')\"")
        started = time.monotonic()
        for name, arguments in (("read_file", {"path": "pipe"}), ("write_file", {"path": "pipe", "content": "x"}),
                                ("patch", {"path": "pipe", "old": "a", "new": "b"}), ("read_file", {"path": "sock"}), ("write_file", {"path": "sock", "content": "x"})):
            outcome = asyncio.run(tools.run(name, arguments))
            assert outcome.status == "error" and "not a regular file" in outcome.as_text(), (name, outcome)
        outcome = asyncio.run(run_task_tests(ws, "from solution import f\n", LIMITS, 1000))
        assert outcome.level in ("nothing_written", "crash")
        assert time.monotonic() - started < 5


def test_proc_tmp_shm_and_user_namespaces() -> None:
    with workspace(sandbox_limits(timeout_s=10, tmp_mb=8)) as (ws, tools):
        first = call(tools, "terminal", command=(
            "ls /proc | grep -cE '^[0-9]+$'; for d in /tmp /var/tmp /dev/shm; do echo x > $d/left 2>/dev/null && echo wrote $d; done; "
            "head -c 20000000 /dev/zero > /dev/shm/big; echo shm=$?; unshare -U true; echo userns=$?; cat /etc/shadow /root/.bash_history 2>&1 | head -2"))
        second = call(tools, "terminal", command="ls /tmp /var/tmp /dev/shm 2>&1; echo listed")
    processes = int(first.splitlines()[0])
    assert processes <= 4, first  # its own processes only (bash, ls, grep and the jail's init)
    assert "shm=1" in first and "userns=1" in first, first  # /dev/shm capped at tmp_mb; no user namespaces
    assert "root:" not in first
    assert "left" not in second and "big" not in second, second  # nothing survives the call


# Beside its own places (its directory, /tmp, /dev/shm), nothing in the jail is writable: bwrap's
# own tmpfs under /, /dev and /opd has no size or file cap (found: 64 MiB and 20,000 files written
# to / by one terminal call whose quotas were 8 MiB and 500 files).
JAIL_PLACES = ["/", "/dev", "/opd", "/opd/bin", "/usr", "/etc"]
WRITE_EVERYWHERE = ("import os\nwrote = []\nfor d in {places!r}:\n    for make in (lambda p: open(p, 'w').close(), os.mkdir):\n"
                    "        try:\n            make(os.path.join(d, 'opd-probe-' + make.__name__))\n            wrote.append(d)\n"
                    "        except OSError:\n            pass\n").format(places=JAIL_PLACES)


def test_nothing_outside_the_calls_own_places_is_writable() -> None:
    own = "open('mine', 'w').close(); open('/tmp/mine', 'w').close(); open('/dev/shm/mine', 'w').close(); open('/dev/null', 'w').write('x')\n"
    result = asyncio.run(run_python(WRITE_EVERYWHERE + own + "print('wrote', wrote)\n", LIMITS))
    assert result.error is None and "wrote []" in result.stdout, result
    with workspace() as (_, tools):
        call(tools, "write_file", path="probe.py", content=WRITE_EVERYWHERE + own + "print('wrote', wrote)\n")
        assert "wrote []\n[exit code 0]" in call(tools, "terminal", command="python probe.py")
        assert "wrote []" in call(tools, "terminal", command="python probe.py; head -c 1000 /dev/zero > /big; echo big=$?")
    solution = WRITE_EVERYWHERE + "def written():\n    return wrote\n"
    outcome = asyncio.run(run_tests(solution, "from solution import written\nassert written() == [], written()\n", LIMITS))
    assert outcome.level == "pass", outcome


def test_the_unshare_backend_is_refused_naming_the_key_and_the_fix() -> None:
    from opd.config import ConfigError

    with pytest.raises(ConfigError, match="env.sandbox.backend=unshare was removed.*bubblewrap") as refused:
        validate(compose(["env.sandbox.backend=unshare"]))
    assert refused.value.key == "env.sandbox.backend"
    assert validate(compose([])).env.sandbox.backend == "bwrap"
