"""A control group per sandboxed call: the memory and process limits of the whole call.

prlimit's limits are per process (RLIMIT_AS: a call that forks eight children may hold eight
times `memory_mb`) or per uid (RLIMIT_NPROC: the call's own only with a leased uid, so a launcher
that is not root sets none). Where the launcher may write the cgroup v1 `memory` and `pids`
hierarchies (root, as on this project's machines), each call runs in a group of its own under
`opd-sandbox/` below the launcher's own group in both (so the launcher's limits, e.g. a Slurm
job's, still bound its calls): `memory.limit_in_bytes` (and the swap-inclusive `memory.memsw`, where the
kernel has it) is `memory_mb` for all its processes together, and `pids.max` is `max_processes`.
The jail's first program joins the groups (a `/bin/sh` step before prlimit) and every process it
starts stays in them; a call that cannot join fails instead of running without them. Where the
hierarchies cannot be written (not root, cgroup v2 only), calls keep the per-process limits and
the launcher says so once, with a warning.

Groups are removed when their call has ended; groups left by a launcher that died are removed
by the next launcher that starts a group.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

logger = logging.getLogger(__name__)

# The cgroup v1 hierarchies of the two controllers, and this project's subtree in each.
ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids")
SUBTREE = "opd-sandbox"
# The jail's first program: join every group named before `--`, then become the rest. Exit code
# 125 (the call fails as a sandbox error) when a group cannot be joined.
JOIN = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
_names = itertools.count()


@lru_cache(maxsize=None)
def base(controller: str) -> Path:
    """`opd-sandbox/` below this process's own group in `controller`'s v1 hierarchy."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            return ROOT / controller / path.lstrip("/") / SUBTREE
    raise FileNotFoundError(f"no cgroup v1 {controller} hierarchy in /proc/self/cgroup")


@lru_cache(maxsize=1)
def available() -> bool:
    """Whether calls get groups of their own here (checked once; a warning when not)."""
    try:
        for controller in CONTROLLERS:
            subtree = base(controller)
            subtree.mkdir(mode=0o755, exist_ok=True)
            if not os.access(subtree / "cgroup.procs", os.W_OK):
                raise PermissionError(f"{subtree} is not writable")
        _sweep()
        return True
    except OSError as err:
        logger.warning("sandboxed calls get no control group of their own (%s: %s); their memory limit is per process and, unless "
                       "the launcher runs as root, they have no process limit (needs root and the cgroup v1 memory and pids "
                       "controllers)", type(err).__name__, err)
        return False


@dataclass(frozen=True)
class CallGroup:
    """The groups of one call, in each controller's hierarchy."""

    name: str

    @property
    def dirs(self) -> list[Path]:
        return [base(controller) / self.name for controller in CONTROLLERS]

    def join_command(self) -> list[str]:
        """The command prefix that puts the jail's first process (and so all of it) in the groups."""
        return ["/bin/sh", "-c", JOIN, "sh", *(str(d / "cgroup.procs") for d in self.dirs), "--"]

    def remove(self, timeout_s: float = 5.0) -> None:
        """Remove the groups once the kernel has let go of their processes (logged if it cannot)."""
        deadline = time.monotonic() + timeout_s
        for directory in self.dirs:
            while True:
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as err:  # EBUSY: processes still leaving (for a moment)
                    if time.monotonic() > deadline:
                        logger.warning("control group %s not removed: %s", directory, err)
                        break
                    time.sleep(0.002)


def create(memory_mb: int, max_processes: int) -> CallGroup | None:
    """A new group for one call with these limits (None where calls get no groups)."""
    if not available():
        return None
    group = CallGroup(f"{os.getpid()}-{next(_names)}")
    memory, pids = group.dirs
    try:
        memory.mkdir(mode=0o755)
        pids.mkdir(mode=0o755)
        limit = str(memory_mb * 1024 * 1024)
        (memory / "memory.limit_in_bytes").write_text(limit)
        swap = memory / "memory.memsw.limit_in_bytes"
        if swap.exists():  # the same limit with swap counted: no way around it by swapping out
            swap.write_text(limit)
        (pids / "pids.max").write_text(str(max_processes))
    except OSError:
        group.remove(0)
        raise
    return group


def _sweep() -> None:
    """Remove the groups of launchers that are gone (empty ones; a busy one is left and logged)."""
    for controller in CONTROLLERS:
        for directory in base(controller).iterdir():
            owner = directory.name.split("-", 1)[0]
            if directory.is_dir() and owner.isdigit() and not _alive(int(owner)):
                with contextlib.suppress(FileNotFoundError):
                    try:
                        directory.rmdir()
                    except OSError as err:
                        logger.warning("stale control group %s not removed: %s", directory, err)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's: alive
        pass
    return True
