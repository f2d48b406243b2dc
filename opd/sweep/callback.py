"""Sweeps (`-m`): one MLflow parent run per sweep, one inference server shared by its jobs.

`SweepCallback` runs in the launching process. At the start of a sweep it creates the parent run
and, with server=local, starts one vLLM server for all jobs; both go into the sweep's state file
(`opd.sweep.state`), which the jobs read.

Hydra calls `on_multirun_end` only when every job succeeded; a job that raises skips it. The parent
run is therefore also closed by an exit hook: FINISHED only after a complete sweep in which every
child finished, FAILED otherwise, and children still RUNNING (a killed job) are marked FAILED.
"""

from __future__ import annotations

import atexit
import copy
import logging
import os
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from opd.sweep.state import SweepState, server_settings, swept_keys, write_state

logger = logging.getLogger(__name__)


class SweepCallback(Callback):
    """Registered under hydra.callbacks in conf/config.yaml; a no-op for single runs."""

    def __init__(self) -> None:
        self.state: SweepState | None = None
        self.server: Any = None
        self.client: Any = None

    def __getstate__(self) -> dict[str, Any]:
        # The joblib and submitit launchers ship the callbacks to the job processes: send none of
        # the launcher's live objects (server process, MLflow client); jobs read the state file.
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from opd.config import validate

        hydra_cfg = config.hydra
        sweep_dir = Path(str(hydra_cfg.sweep.dir)).resolve()
        job_cfg = copy.deepcopy(config)
        with read_write(job_cfg), open_dict(job_cfg):  # what Hydra does to make a job's config
            del job_cfg["hydra"]
            job_cfg.output_dir = str(sweep_dir)
        typed = validate(job_cfg)
        if typed.sweep.seeds > 1:
            self._sweep_seeds(config, typed.seed, typed.sweep.seeds)
        params = OmegaConf.to_container(hydra_cfg.sweeper.params, resolve=False) if OmegaConf.select(hydra_cfg, "sweeper.params") else None
        state = SweepState(sweep_dir=str(sweep_dir), swept=swept_keys(list(hydra_cfg.overrides.task), params))
        # Registered before anything is created, so a failure below still closes what exists.
        atexit.register(self._finish, completed=False)
        self.state = state
        if typed.tracking.enabled:
            self._open_parent(typed, state, list(hydra_cfg.overrides.task))
        launcher = str(OmegaConf.select(hydra_cfg, "launcher._target_") or "")
        if typed.server.kind == "local" and typed.sweep.share_server:
            if "submitit" in launcher:
                logger.warning("sweep.share_server: jobs on other machines cannot reach a loopback server; each job starts its own")
            elif typed.trainer.kind == "local" and "joblib" in launcher:
                # Each job's trainer reloads the served weights: jobs at once would train each other's.
                logger.info("sweep.share_server: jobs with trainer=local run at once here, so each starts its own server")
            else:
                self._start_server(typed, state)
        path = write_state(state)
        logger.info("sweep state in %s (swept: %s)", path, ", ".join(state.swept) or "nothing")

    @staticmethod
    def _sweep_seeds(config: DictConfig, seed: int, seeds: int) -> None:
        """sweep.seeds > 1: every sweep point runs with seed, seed + 1, ...: the override
        `seed=<those>` joins the sweep's task overrides, which Hydra's sweeper reads after this
        callback (a plain `seed=K` sets where they start)."""
        from opd.config import ConfigError

        sweeper = str(OmegaConf.select(config.hydra, "sweeper._target_") or "")
        if not sweeper.endswith("BasicSweeper"):
            raise ConfigError(f"sweep.seeds: runs every point of a grid (Hydra's basic sweeper), not with {sweeper}; sweep seed= yourself", "sweep.seeds")
        task = [str(o) for o in config.hydra.overrides.task]
        if "seed" in swept_keys(task, OmegaConf.to_container(config.hydra.sweeper.params, resolve=False) if OmegaConf.select(config.hydra, "sweeper.params") else None):
            raise ConfigError("sweep.seeds: seed is swept already; sweep seeds one way, either seed=a,b,c or sweep.seeds=N", "sweep.seeds")
        values = ",".join(str(seed + i) for i in range(seeds))
        task = [o for o in task if o.split("=", 1)[0].lstrip("+~") != "seed"] + [f"seed={values}"]
        with read_write(config.hydra), open_dict(config.hydra):
            config.hydra.overrides.task = task
        logger.info("sweep.seeds=%d: every point runs with seed=%s", seeds, values)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._finish(completed=True)

    def _open_parent(self, typed: Any, state: SweepState, overrides: list[str]) -> None:
        import mlflow

        from opd.tracking.run import ensure_experiment, system_tags
        from opd.tracking.store import absolute_tracking_uri, artifact_location

        uri = absolute_tracking_uri(typed.tracking.uri)
        self.client = mlflow.MlflowClient(uri)
        experiment_id = ensure_experiment(self.client, typed.tracking.experiment, artifact_location(uri, typed.tracking.artifact_root))
        sweep_dir = Path(state.sweep_dir)
        name = f"sweep {sweep_dir.parent.name}/{sweep_dir.name}"
        run = self.client.create_run(experiment_id, run_name=name, tags={
            **system_tags(),
            "opd.sweep_dir": state.sweep_dir,
            "opd.swept": ",".join(state.swept),
            "opd.overrides": " ".join(overrides)[:5000],
            "opd.launcher_pid": str(os.getpid()),
        })
        state.parent_run_id, state.tracking_uri, state.experiment_id = run.info.run_id, uri, experiment_id
        logger.info("MLflow sweep parent run %s (%s) in experiment %s", run.info.run_id, name, typed.tracking.experiment)

    def _start_server(self, typed: Any, state: SweepState) -> None:
        from opd.build import local_server, resolve_model

        self.server = local_server(typed, resolve_model(typed.server.model), Path(state.sweep_dir) / "vllm")
        state.server_urls = [self.server.start()]
        state.server_settings = {**server_settings(typed.server), "max_logprobs": typed.server.max_logprobs}
        logger.info("shared inference server for the sweep: %s", state.server_urls[0])

    def _finish(self, completed: bool) -> None:
        """Close the parent run (FINISHED only if the sweep completed and every child finished); stop the server."""
        state, self.state = self.state, None
        if state is None:
            return
        atexit.unregister(self._finish)
        try:
            if self.client is not None and state.parent_run_id:
                self._close_parent(state, completed)
        finally:
            if self.server is not None:
                self.server.stop()
                self.server = None

    def _close_parent(self, state: SweepState, completed: bool) -> None:
        children = self.client.search_runs(
            [state.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{state.parent_run_id}'", max_results=10000,
        )
        for child in children:
            if child.info.status == "RUNNING":
                logger.error("sweep job run %s was still RUNNING at the end of the sweep; marking it FAILED", child.info.run_id)
                self.client.set_terminated(child.info.run_id, "FAILED")
        ok = completed and all(child.info.status == "FINISHED" for child in children)
        status = "FINISHED" if ok else "FAILED"
        self.client.set_tag(state.parent_run_id, "opd.jobs", str(len(children)))
        self.client.set_terminated(state.parent_run_id, status)
        logger.info("sweep parent run %s ended %s (%d job runs)", state.parent_run_id, status, len(children))
