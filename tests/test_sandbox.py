"""The jail (opd.jail.sandbox): output, limits in force, namespaces, uids, clean-up, and limits
reported in words."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from conftest import sandbox_limits
from opd.jail import call_dirs, command
from opd.jail import uids as uid_leases
from opd.jail.call_dirs import CallDirs
from opd.jail.sandbox import run_python
from opd.jail.uids import UidLease

FAST = sandbox_limits(timeout_s=3, cpu_s=3, memory_mb=512, output_chars=500)
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="leased uids need a root launcher")


def run(code: str, limits=FAST):
    return asyncio.run(run_python(code, limits))


def test_prints_stdout_and_last_expression() -> None:
    result = run("x = 6\nprint('hello')\nx * 7")
    assert result.error is None and result.exit_code == 0
    assert result.stdout == "hello\n42\n"


def test_exceptions_come_back_as_stderr() -> None:
    result = run("1 / 0")
    assert result.exit_code == 1 and "ZeroDivisionError" in result.stderr and result.error == "exited with code 1"


def test_environment_is_scrubbed() -> None:
    os.environ["OPD_SECRET_FOR_TEST"] = "hunter2"
    try:
        result = run("import os; print(sorted(os.environ))")
    finally:
        del os.environ["OPD_SECRET_FOR_TEST"]
    assert "OPD_SECRET_FOR_TEST" not in result.stdout and "hunter2" not in result.stdout


def test_the_limits_are_in_force_inside() -> None:
    limits = sandbox_limits(cpu_s=7, memory_mb=512, file_size_mb=4, max_open_files=32, max_processes=20)
    code = (
        "import os, resource\n"
        "print([resource.getrlimit(r) for r in (resource.RLIMIT_CPU, resource.RLIMIT_AS, resource.RLIMIT_FSIZE, resource.RLIMIT_NOFILE, resource.RLIMIT_CORE)])\n"
        "print(resource.getrlimit(resource.RLIMIT_NPROC)[0], os.getpid(), os.getuid(), len([p for p in os.listdir('/proc') if p.isdigit()]))\n"
    )
    result = run(code, limits)
    assert result.error is None, result
    rlimits, ids = result.stdout.splitlines()
    mib = 1024 * 1024
    assert rlimits == str([(7, 8), (512 * mib, 512 * mib), (4 * mib, 4 * mib), (32, 32), (0, 0)])
    nproc, pid, uid, processes = (int(x) for x in ids.split())
    assert pid <= 3 and processes <= 3  # a PID namespace of its own: it sees only itself (and the jail's init)
    if os.geteuid() == 0:
        assert limits.uid_base <= uid < limits.uid_base + uid_leases.UID_COUNT and nproc == 20


@ROOT_ONLY
def test_leases_never_share_a_uid_and_free_it_when_released() -> None:
    leases = [UidLease.take(300_000) for _ in range(50)]
    uids = {lease.uid for lease in leases}
    assert len(uids) == 50 and all(300_000 <= u < 300_000 + uid_leases.UID_COUNT for u in uids)
    held = leases[0].uid
    for lease in leases:
        lease.release()
    # A lease held by another process on the machine is not taken either.
    import subprocess
    import sys

    holder = subprocess.Popen([sys.executable, "-c", f"import fcntl, os, sys, time\nfd = os.open({str(uid_leases._lock_dir() / str(held))!r}, os.O_RDWR | os.O_CREAT, 0o600)\n"
                               "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(30)\n"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert all(UidLease.take(held).uid != held for _ in range(3))
    finally:
        holder.kill()
        holder.wait()


def test_works_in_its_own_directory_which_is_removed() -> None:
    result = run("import os; print(os.getcwd()); open('f.txt', 'w').write('x')")
    workdir = result.stdout.strip()
    assert "opd-sandbox-" in workdir and "/python-" in workdir and not os.path.exists(workdir)


@pytest.mark.parametrize(("code", "limits", "words"), [
    ("while True: pass", sandbox_limits(timeout_s=20, cpu_s=1), "CPU limit (1 s)"),
    pytest.param("import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True: pass", sandbox_limits(timeout_s=20, cpu_s=1),
                 "SIGKILL (the CPU limit's hard stop at 2 s", marks=pytest.mark.slow),
    ("import time\ntime.sleep(60)", sandbox_limits(timeout_s=1), "wall-clock limit (1 s)"),
    ("a = bytearray(4 * 1024 ** 3)", sandbox_limits(memory_mb=256), "memory at the limit (256 MiB)"),
    ("open('big', 'wb').write(b'0' * (8 * 2 ** 20))", sandbox_limits(file_size_mb=4), "file-size limit (4 MiB per file)"),
    ("import ctypes\nctypes.string_at(0)", FAST, "killed by SIGSEGV"),
    ("import os\nos.abort()", FAST, "killed by SIGABRT"),
    ("raise SystemExit(3)", FAST, "exited with code 3"),
])
def test_what_stopped_a_call_is_said_in_words(code: str, limits, words: str) -> None:
    result = run(code, limits)
    assert result.error is not None and words in result.error, result
    if "SIGSEGV" in words:
        assert "limit" not in result.error  # a crash is not blamed on a limit


def test_a_missing_bwrap_is_an_error_that_names_the_fix(monkeypatch) -> None:
    monkeypatch.setattr(command.shutil, "which", lambda name, *a, **k: None)
    command._bwrap_path.cache_clear()
    command.check_backend.cache_clear()
    try:
        with pytest.raises(command.SandboxUnavailable, match="apt-get install bubblewrap"):
            run("1")
    finally:
        command._bwrap_path.cache_clear()
        command.check_backend.cache_clear()




def test_directories_of_killed_launchers_are_swept(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = "from opd.jail.call_dirs import launcher_dirs\nprint(launcher_dirs().root, flush=True)\nimport time; time.sleep(60)\n"
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=Path(__file__).parent, stdout=subprocess.PIPE, text=True)
    root = Path(proc.stdout.readline().strip())
    assert root.is_dir()
    CallDirs(root.parent)  # a live launcher's directory stays
    assert root.is_dir()
    proc.kill()
    proc.wait()
    dirs = CallDirs(root.parent)  # a killed one's is removed, by a thread
    dirs.sweeper.join(30)
    assert not root.exists()


def test_a_zombie_counts_until_it_is_reaped_as_a_living_process_does() -> None:
    """A failed call waits until its uid's processes are gone, zombies included: an unreaped
    zombie still holds one of the uid's process slots, so a workspace that did not wait for them
    would gather one per call until its process limit refused every call."""
    import subprocess
    import time

    from opd.jail.reaping import processes_of

    sleeper, done = subprocess.Popen(["sleep", "60"]), subprocess.Popen(["true"])
    try:
        deadline = time.monotonic() + 30
        while Path(f"/proc/{done.pid}/stat").read_bytes().rpartition(b")")[2].split()[0] != b"Z":
            assert time.monotonic() < deadline, "the child never became a zombie"
            time.sleep(0.01)
        present = processes_of(os.getuid())
        assert sleeper.pid in present and os.getpid() in present and done.pid in present
    finally:
        sleeper.kill()
        sleeper.wait()
        done.wait()
    present = processes_of(os.getuid())
    assert sleeper.pid not in present and done.pid not in present


def _dead_pid() -> int:
    import subprocess

    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_the_sweep_removes_any_tree_and_skips_what_it_cannot_remove(tmp_path: Path, monkeypatch, caplog) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("untouched")
    base = tmp_path / "tmp"
    base.mkdir()
    deep, stuck = base / f"opd-sandbox-{_dead_pid()}-deep", base / f"opd-sandbox-{_dead_pid()}-stuck"
    # A chain deeper than the recursion limit, a path past PATH_MAX, and a link out.
    fd = os.open(deep.parent, os.O_RDONLY)
    for name in [deep.name] + ["d"] * 1500 + ["n" * 250] * 20:
        os.mkdir(name, dir_fd=fd)
        fd, parent = os.open(name, os.O_RDONLY, dir_fd=fd), fd
        os.close(parent)
    os.symlink(outside, "link", dir_fd=fd)
    os.close(os.open("f", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
    os.close(fd)
    stuck.mkdir()
    real_rm = call_dirs._rm
    monkeypatch.setattr(call_dirs, "_rm", lambda path: ["sh", "-c", "echo cannot >&2; exit 1"] if path == stuck else real_rm(path))
    dirs = CallDirs(base)
    dirs.sweeper.join(60)
    assert not deep.exists() and stuck.is_dir() and outside.read_text() == "untouched"
    assert f"could not remove {stuck} (rm exited with 1): cannot" in caplog.text
    assert dirs.root.parent == base and dirs.root.is_dir()  # this launcher goes on


@ROOT_ONLY
def test_uid_leases_are_machine_wide_whatever_tmpdir_says(tmp_path: Path) -> None:
    import subprocess
    import sys

    base = 310_000
    # Both start their search at `base`: the second must pass over the first's lease.
    take = "import random\nrandom.randrange = lambda n: 0\nfrom opd.jail.uids import UidLease\nlease = UidLease.take({base})\n"
    holder = subprocess.Popen([sys.executable, "-c", take.format(base=base) + "print(lease.uid, flush=True)\nimport time; time.sleep(30)\n"],
                              cwd=Path(__file__).parent.parent, env={**os.environ, "TMPDIR": str(tmp_path)}, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == str(base)
        mine = subprocess.run([sys.executable, "-c", take.format(base=base) + "print(lease.uid)"], cwd=Path(__file__).parent.parent,
                              capture_output=True, text=True, check=True)
        assert mine.stdout.strip() == str(base + 1)
    finally:
        holder.kill()
        holder.wait()


@ROOT_ONLY
def test_the_lease_directory_is_made_safely(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(uid_leases, "LOCK_PARENTS", (str(tmp_path / "missing"), str(tmp_path)))
    path = tmp_path / uid_leases.LOCK_DIR_NAME
    try:
        uid_leases._lock_dir.cache_clear()
        assert uid_leases._lock_dir() == path and (path.stat().st_mode & 0o777) == 0o700
        uid_leases._lock_dir.cache_clear()
        path.chmod(0o777)
        assert uid_leases._lock_dir() == path and (path.stat().st_mode & 0o777) == 0o700
        path.rmdir()
        path.symlink_to(tmp_path / "elsewhere")
        (tmp_path / "elsewhere").mkdir()
        uid_leases._lock_dir.cache_clear()
        with pytest.raises(command.SandboxUnavailable, match="not a symlink"):
            uid_leases._lock_dir()
        path.unlink()
        path.mkdir(mode=0o700)
        os.chown(path, 12345, 12345)
        uid_leases._lock_dir.cache_clear()
        with pytest.raises(command.SandboxUnavailable, match="belongs to uid 12345"):
            uid_leases._lock_dir()
        tmp_path.chmod(0o777)  # a parent where others may rename entries is passed over
        uid_leases._lock_dir.cache_clear()
        with pytest.raises(command.SandboxUnavailable, match="no directory for uid leases"):
            uid_leases._lock_dir()
    finally:
        tmp_path.chmod(0o700)
        uid_leases._lock_dir.cache_clear()
