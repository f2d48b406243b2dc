"""Entry point: `python -m experiments.launch env=inline_math total_steps=3 ...` (Hydra).

compose (Hydra) -> validate (errors name the key, before any server starts) -> run the experiment
(`opd.experiment`: data, MLflow run, servers, environment, sinks) -> return the objective to the sweeper.
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

os.environ.setdefault("WANDB_MODE", "disabled")  # atroposlib imports wandb; never let it start
os.environ.setdefault("WANDB_SILENT", "true")

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from opd.cli import JobFailed, fail, guard_hydra_files, log_path, register_help, report_errors, say_error  # noqa: E402
from opd.config import ConfigError, register, validate  # noqa: E402
from opd.event_loop import interrupt  # noqa: E402

logger = logging.getLogger("experiments.launch")
register()
register_help()
guard_hydra_files()


def _run_failures() -> tuple[type[BaseException], ...]:
    """Errors that end a run for a reason its message says in full (a server lost, too many failed
    groups, tracking that failed, served weights that are not the trained ones): the console shows
    the message, the log also the traceback."""
    from opd.run_files import RunFileError
    from opd.runner import TooManyDropped, TooManyFailures
    from opd.serving.local_vllm import ServerStartError
    from opd.serving.watch import ServerLost
    from opd.sinks.atropos import TrainerAPIError
    from opd.sweep.slurm import StoppedBySlurm
    from opd.tracking.mlflow_run import TrackingFailed
    from opd.train.refresh_check import RefreshMismatch

    return (ServerLost, ServerStartError, TooManyFailures, TooManyDropped, TrackingFailed, TrainerAPIError, StoppedBySlurm, RunFileError,
            RefreshMismatch)


def launch(cfg: DictConfig) -> float:
    """Run one experiment from a composed config; return its objective."""
    from hydra.core.hydra_config import HydraConfig

    from opd.experiment import run_experiment
    from opd.sweep.slurm import stopped_by_slurm
    from opd.sweep.state import current_job

    asked = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    with stopped_by_slurm():
        return run_experiment(validate(cfg), current_job(), asked)


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    in_sweep = HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        return launch(cfg)
    except Exception as err:
        known = isinstance(err, (ConfigError, *_run_failures()))
        if not known or in_sweep:
            logger.error("the run's traceback", exc_info=True, extra={"file_only": True})
        if in_sweep:
            # This job's reason, on the console at once and last in its log (Hydra's launchers
            # would show it only after the whole sweep); the sweep's other jobs still run.
            raise JobFailed(say_error(job_failure(err))[len("error: "):]) from err
        if isinstance(err, ConfigError):
            fail(str(err))  # a bad value: one line naming the key, before any server started
        if not known:
            raise  # a defect: Hydra prints its traceback (also in the log, above)
        fail(f"the run failed: {type(err).__name__}: {err} (traceback in {log_path() or 'the log'})", 1)


def job_failure(err: BaseException) -> str:
    """The line a failed sweep job says: which job, why, where its traceback is."""
    from opd.sweep.progress import job_line
    from opd.sweep.state import current_job, run_name

    try:
        job = current_job()
    except Exception:  # noqa: BLE001 - the job's state is what failed: say the rest
        job = None
    where = f"{job_line(job.state, job.num).split(' (', 1)[0]} ({run_name(job.swept)})" if job is not None else "sweep job"
    why = str(err) if isinstance(err, ConfigError) else f"{type(err).__name__}: {err}"
    return f"{where} failed: {why} (traceback in {log_path() or 'its launch.log'})"


def _terminated(signum: int, frame: Any) -> None:
    # SIGTERM (kill, Slurm preemption) unwinds like Ctrl-C: servers stopped, runs marked KILLED.
    interrupt(f"signal {signum}")


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _terminated)
    report_errors()  # a bad input on the command line: one line, not Hydra's report
    main()
