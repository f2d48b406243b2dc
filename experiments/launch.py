"""Entry point: `python -m experiments.launch env=inline_math total_steps=3 ...` (Hydra).

compose (Hydra) -> validate (errors name the key, before any server starts) -> run the experiment
(`opd.run`: data, MLflow run, servers, environment, sinks) -> return the objective to the sweeper.
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

from opd.config import ConfigError, register, validate  # noqa: E402

logger = logging.getLogger("experiments.launch")
register()


def launch(cfg: DictConfig) -> float:
    """Run one experiment from a composed config; return its objective."""
    from opd.run import run_experiment
    from opd.sweep.slurm import stopped_by_slurm
    from opd.sweep.state import current_job

    with stopped_by_slurm():
        return run_experiment(validate(cfg), current_job())


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    try:
        return launch(cfg)
    except ConfigError as err:
        # A bad value: one clear line naming the key, no traceback.
        logger.error("configuration error: %s", err)
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            raise  # in a sweep: this job fails, the others still run, the sweep reports it
        raise SystemExit(2) from None


def _terminated(signum: int, frame: Any) -> None:
    # SIGTERM (kill, SLURM preemption) unwinds like Ctrl-C: servers stopped, runs marked KILLED.
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _terminated)
    main()
