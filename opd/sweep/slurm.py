"""A sweep job under Slurm (hydra/launcher=slurm) stops like a Ctrl-C'd run when Slurm says so.

Slurm sends SIGUSR2 `signal_delay_s` before a job's time limit (and on preemption) and SIGTERM
at the limit or on `scancel`, then SIGKILL (KillWait later). submitit's own handlers ignore SIGTERM,
and on SIGUSR2 either requeue the job and exit (preempted) or, with hydra-submitit's
`max_num_timeout: 0`, raise an ordinary exception (timed out) in whatever the main thread runs: a
group's `except Exception` counts it as a failed group and the run goes on until SIGKILL, leaving
its MLflow run RUNNING and (without accounting, as on the test cluster) the launcher waiting for a
result that never comes. Here both signals stop the run as Ctrl-C does (`opd.event_loop.interrupt`:
cancelled at its next await while its event loop runs, interrupted at once outside it), ending in
a KeyboardInterrupt that nothing catches on the way: servers stop, the run ends KILLED with its
written groups kept, and the job then raises `StoppedBySlurm`, which submitit records as the job's
result, so the launcher reports it and the sweep's parent ends FAILED. A preempted job is therefore
not requeued (a sweep job cannot resume: its rerun would find its groups and refuse to start). A
job that ends without a result at all is the launcher's to notice (`opd.sweep.slurm_watch`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from types import FrameType
from typing import Iterator

from opd.event_loop import interrupt

logger = logging.getLogger(__name__)

SIGNALS = {signal.SIGUSR2: "its time limit is near (timeout_min) or it was preempted", signal.SIGTERM: "it was cancelled or reached its time limit"}


class StoppedBySlurm(RuntimeError):
    """Slurm stopped this sweep job before it finished."""


def _interrupt(signum: int, frame: FrameType | None) -> None:
    interrupt(f"Slurm sent {signal.Signals(signum).name}: {SIGNALS[signal.Signals(signum)]}")


@contextlib.contextmanager
def stopped_by_slurm() -> Iterator[None]:
    """Around a sweep job's run: in a submitit Slurm job, SIGUSR2 and SIGTERM interrupt the run
    and leave as `StoppedBySlurm`; elsewhere nothing changes."""
    if os.environ.get("SUBMITIT_EXECUTOR") != "slurm":
        yield
        return
    previous = {signum: signal.signal(signum, _interrupt) for signum in SIGNALS}
    try:
        yield
    except KeyboardInterrupt as err:
        logger.error("Slurm job %s stopped: %s", os.environ.get("SLURM_JOB_ID", "?"), err)
        raise StoppedBySlurm(str(err)) from err
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
