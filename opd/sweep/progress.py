"""A sweep's progress as its user reads it: "job i of N" with an ETA in each job's log, and, when
jobs run at once in this machine's processes (hydra/launcher=joblib), one progress bar in the
launcher for all of them instead of one per job overwriting each other.

Both read only the sweep directory: a job is done when its folder has `summary.json` (written at
the end of every run), and groups written are the lines of each job's groups.jsonl.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from tqdm import tqdm

from opd.run_files import open_file
from opd.runner import duration
from opd.sweep.state import SweepState

logger = logging.getLogger(__name__)

SUMMARY_FILE = "summary.json"


def jobs_done(sweep_dir: str | Path) -> int:
    """Jobs of the sweep that have finished (their folder holds summary.json)."""
    return sum(1 for _ in Path(sweep_dir).glob(f"*/{SUMMARY_FILE}"))


def job_line(state: SweepState, num: int, now: float | None = None) -> str:
    """`sweep job 3 of 6 (2 done in 4 min, ETA 8 min)` for job `num` (from 0)."""
    now = time.time() if now is None else now
    of = f" of {state.jobs}" if state.jobs else ""
    done = jobs_done(state.sweep_dir)
    if not done or state.started is None:
        return f"sweep job {num + 1}{of} (none done yet)"
    elapsed = now - state.started
    eta = f", ETA {duration(elapsed / done * (state.jobs - done))}" if state.jobs and state.jobs > done else ""
    return f"sweep job {num + 1}{of} ({done} done in {duration(elapsed)}{eta})"


class _LineCounter:
    """Lines of a growing file, reading only what was appended since the last look."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.lines = path, 0, 0

    def count(self) -> int:
        try:
            with open_file(self.path, "rb") as handle:  # a FIFO or a link in a job's folder is not waited on or followed
                handle.seek(self.offset)
                while chunk := handle.read(1 << 20):
                    self.lines += chunk.count(b"\n")
                    self.offset += len(chunk)
        except OSError:
            pass
        return self.lines


class SweepProgress:
    """One progress bar for a sweep whose jobs run at once: groups written by all jobs (of
    `jobs` x `steps` when both are known) and jobs done, redrawn every `every_s` seconds by a
    thread of the launcher until `stop()`."""

    def __init__(self, sweep_dir: str | Path, jobs: int | None, steps: int | None, every_s: float = 2.0) -> None:
        self.sweep_dir = Path(sweep_dir)
        self.jobs = jobs
        self.every_s = every_s
        self.counters: dict[Path, _LineCounter] = {}
        total = jobs * steps if jobs and steps else None
        self.bar = tqdm(total=total, desc="sweep", unit="group", dynamic_ncols=True)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sweep-progress", daemon=True)
        self._thread.start()

    def _update(self) -> None:
        for path in self.sweep_dir.glob("*/groups.jsonl"):
            self.counters.setdefault(path, _LineCounter(path))
        written = sum(counter.count() for counter in self.counters.values())
        self.bar.update(written - self.bar.n)
        self.bar.set_postfix_str(f"jobs done {jobs_done(self.sweep_dir)}/{self.jobs or '?'}")

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._update()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._update()
        self.bar.close()
