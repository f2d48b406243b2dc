"""What a jailed call left: its output, read back cut to a limit, and in words what stopped it."""

from __future__ import annotations

import signal
from pathlib import Path

from opd.config import SandboxConfig


def read_cut(path: Path, limit: int) -> str:
    """The text of a capture file, cut to `limit` characters (saying so)."""
    with open(path, "rb") as handle:
        data = handle.read(limit * 4 + 1)
    text = data.decode("utf-8", errors="replace")
    if len(text) > limit or len(data) > limit * 4:
        return text[:limit] + f"\n...[truncated at {limit} characters]"
    return text


def stopped_by(code: int | None, timed_out: bool, stderr: str, limits: SandboxConfig) -> str | None:
    """What ended the call, in words (None for a clean exit)."""
    if timed_out:
        return f"stopped at the wall-clock limit ({limits.timeout_s:g} s)"
    if code == 0:
        return None
    signum = -code if code is not None and code < 0 else (code - 128 if code is not None and 128 < code < 160 else None)
    if signum == signal.SIGXCPU:
        return f"stopped at the CPU limit ({limits.cpu_s} s)"
    if signum == signal.SIGKILL:
        return f"killed by SIGKILL (the CPU limit's hard stop at {limits.cpu_s + 1} s, or out of memory)"
    if signum == signal.SIGXFSZ or "[Errno 27] File too large" in stderr:
        return f"stopped at the file-size limit ({limits.file_size_mb} MiB per file)"
    if "MemoryError" in stderr or "Cannot allocate memory" in stderr:
        return f"ran out of memory at the limit ({limits.memory_mb} MiB) and exited with code {code}"
    if "Resource temporarily unavailable" in stderr or "BlockingIOError" in stderr:
        return f"hit the process limit ({limits.max_processes}) and exited with code {code}"
    if signum is not None:
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        return f"killed by {name}"
    return f"exited with code {code}"

