"""Sweeps (`-m`): one MLflow parent run per sweep, one inference server shared by its jobs (and
one teacher server, with teacher=model).

`SweepCallback` runs in the launching process. At the start of a sweep it checks the config (a bad
one stops the sweep with one line, before any job), creates the parent run (named from what was
asked) and, with server=local, starts one vLLM server for all jobs, beside the server the
teacher component shares (`Teacher.shared_server`, opd.teachers: teacher=model's local one); all
of it goes into the sweep's state file (`opd.sweep.state`), which the jobs read. Each job logs
its objective to the parent too (at its job number), so the parent's charts show the sweep; when
jobs run at once here, the launcher shows one progress bar for all of them (`opd.sweep.progress`).

Hydra calls `on_multirun_end` only when every job succeeded; a job that raises skips it. The parent
run is therefore also closed by an exit hook: FINISHED only after a complete sweep in which every
child finished, FAILED otherwise, and children still RUNNING (a killed job) are marked FAILED.
"""

from __future__ import annotations

import atexit
import copy
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from opd.sweep.state import SweepState, count_jobs, server_settings, swept_keys, write_state

logger = logging.getLogger(__name__)


class SweepCallback(Callback):
    """Registered under hydra.callbacks in conf/config.yaml; a no-op for single runs."""

    def __init__(self) -> None:
        self.state: SweepState | None = None
        self.server: Any = None
        self.teacher_server: Any = None
        self.client: Any = None
        self.progress: Any = None

    def __getstate__(self) -> dict[str, Any]:
        # The joblib and submitit launchers ship the callbacks to the job processes: send none of
        # the launcher's live objects (server process, MLflow client); jobs read the state file.
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from opd.cli import fail
        from opd.config import ConfigError

        try:
            self._start(config)
        except ConfigError as err:
            # Hydra only warns about an error raised here and would start every job anyway.
            self._finish(completed=False)
            fail(str(err))

    def _start(self, config: DictConfig) -> None:
        from opd.config import validate
        from opd.sinks.registry import check_sinks
        from opd.teachers import teacher_of

        hydra_cfg = config.hydra
        sweep_dir = Path(str(hydra_cfg.sweep.dir)).resolve()
        job_cfg = copy.deepcopy(config)
        with read_write(job_cfg), open_dict(job_cfg):  # what Hydra does to make a job's config
            del job_cfg["hydra"]
            job_cfg.output_dir = str(sweep_dir)
        typed = validate(job_cfg)
        check_sinks(typed)  # what the sinks declare (a needed one left out, a bad setting): before any job
        teacher = teacher_of(typed)  # a kind not registered: before any job
        if typed.sweep.seeds > 1:
            self._sweep_seeds(config, typed.seed, typed.sweep.seeds)  # before the jobs are counted: it sweeps seed
        params = OmegaConf.to_container(hydra_cfg.sweeper.params, resolve=False) if OmegaConf.select(hydra_cfg, "sweeper.params") else None
        task = list(hydra_cfg.overrides.task)
        launcher = str(OmegaConf.select(hydra_cfg, "launcher._target_") or "")
        jobs = count_jobs(task, str(OmegaConf.select(hydra_cfg, "sweeper._target_") or ""), params, OmegaConf.select(hydra_cfg, "sweeper.n_trials"))
        parallel = "joblib" in launcher and OmegaConf.select(hydra_cfg, "launcher.n_jobs") not in (1,)
        if launcher.endswith(".SlurmLauncher"):
            from opd.sweep.slurm_watch import watch_jobs

            watch_jobs()  # a job that ends without a result fails, on a cluster without accounting too
        state = SweepState(sweep_dir=str(sweep_dir), swept=swept_keys(task, params), jobs=jobs, started=time.time(), parallel=parallel)
        # Registered before anything is created, so a failure below still closes what exists.
        atexit.register(self._finish, completed=False)
        self.state = state
        if typed.tracking.enabled:
            self._open_parent(typed, state, task)
        # The teacher's own server for every job, where its kind has one to share (not started yet).
        teacher_server = teacher.shared_server(sweep_dir / "vllm_teacher")
        if (typed.server.kind == "local" or teacher_server is not None) and typed.sweep.share_server:
            if "submitit" in launcher:
                logger.warning("sweep.share_server: jobs on other machines cannot reach a loopback server; each job starts its own")
            elif typed.trainer.kind == "local" and "joblib" in launcher:
                # Each job's trainer reloads the served weights: jobs at once would train each other's.
                logger.info("sweep.share_server: jobs with trainer=local run at once here, so each starts its own server")
            else:
                self._start_servers(typed, state, teacher_server)
        state.started = time.time()  # the jobs' clock: their ETA leaves out the shared server's start-up
        path = write_state(state)
        logger.info("sweep of %s jobs, state in %s (swept: %s)", jobs if jobs is not None else "?", path, ", ".join(state.swept) or "nothing")
        if parallel and typed.runner.progress:
            from opd.sweep.progress import SweepProgress

            steps = None if "total_steps" in state.swept else typed.total_steps
            self.progress = SweepProgress(sweep_dir, jobs, steps)

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
        from mlflow.tracking.context import registry as context

        from opd.tracking.mlflow_run import ensure_experiment, model_label, run_title, source_tags, system_tags
        from opd.tracking.secrets import mask_overrides
        from opd.tracking.store import absolute_tracking_uri, artifact_location, check_store
        from opd.tracking.ui import sweep_view, ui_base, view_link

        check_store(typed.tracking.uri, typed.tracking.artifact_root)  # a bad store: one line, before any job
        logging.getLogger("mlflow").setLevel(logging.WARNING)  # its INFO lines (creating tables, ...) are noise on the sweep's console
        uri = absolute_tracking_uri(typed.tracking.uri)
        self.client = mlflow.MlflowClient(uri)
        experiment_id = ensure_experiment(self.client, typed.tracking.experiment, artifact_location(uri, typed.tracking.artifact_root))
        name = "sweep " + run_title(typed.env.name, model_label(typed), overrides)
        run = self.client.create_run(experiment_id, run_name=name, start_time=int((state.started or time.time()) * 1000), tags=context.resolve_tags({
            **system_tags(),
            **source_tags(sys.argv),
            "opd.sweep_dir": state.sweep_dir,
            "opd.swept": ",".join(state.swept),
            "opd.overrides": " ".join(mask_overrides(overrides))[:5000],
            "opd.launcher_pid": str(os.getpid()),
            **({"opd.jobs_planned": str(state.jobs)} if state.jobs is not None else {}),
        }))
        state.parent_run_id, state.tracking_uri, state.experiment_id = run.info.run_id, uri, experiment_id
        # The jobs' runs as a saved view of the experiment: the swept keys as columns, the objective.
        self.client.set_experiment_tag(experiment_id, *sweep_view(run.info.run_id, name, state.swept, ["objective"]))
        logger.info("MLflow sweep parent run %s (%s) in experiment %s; its jobs' runs: %s", run.info.run_id, name, typed.tracking.experiment,
                    view_link(ui_base(uri), experiment_id, run.info.run_id))

    def _start_server(self, typed: Any, state: SweepState) -> None:
        from opd.build import resolve_model
        from opd.serving.lifecycle import local_server

        self.server = local_server(typed, resolve_model(typed.server.model), Path(state.sweep_dir) / "vllm")
        state.server_urls = [self.server.start()]
        state.server_settings = {**server_settings(typed.server), "max_logprobs": typed.server.max_logprobs}
        logger.info("shared inference server for the sweep: %s", state.server_urls[0])

    def _start_servers(self, typed: Any, state: SweepState, teacher: Any) -> None:
        """The policy's shared server (server=local) and the teacher's (`teacher`, a
        `SharedServer` or None), started side by side (each is stopped by `_finish`, whichever fails)."""
        from concurrent.futures import ThreadPoolExecutor
        from functools import partial

        starts = [partial(self._start_server, typed, state)] if typed.server.kind == "local" else []
        if teacher is not None:
            starts.append(partial(self._start_teacher_server, teacher, state))
        with ThreadPoolExecutor(len(starts), thread_name_prefix="sweep-server") as pool:
            for started in [pool.submit(start) for start in starts]:
                started.result()

    def _start_teacher_server(self, server: Any, state: SweepState) -> None:
        """The teacher component's shared server, for every job."""
        self.teacher_server = server  # stopped by _finish even if its start fails
        state.teacher_urls, state.teacher_settings = server.start()
        logger.info("shared teacher server for the sweep: %s", ", ".join(state.teacher_urls))

    def _finish(self, completed: bool) -> None:
        """Close the parent run (FINISHED only if the sweep completed and every child finished); stop the server."""
        state, self.state = self.state, None
        if state is None:
            return
        atexit.unregister(self._finish)
        try:
            if self.progress is not None:
                self.progress.stop()
                self.progress = None
            if self.client is not None and state.parent_run_id:
                self._close_parent(state, completed)
        finally:
            for name in ("server", "teacher_server"):
                if getattr(self, name) is not None:
                    getattr(self, name).stop()
                    setattr(self, name, None)

    def _close_parent(self, state: SweepState, completed: bool) -> None:
        from opd.tracking.ui import ui_base, view_link

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
        self._log_outcome(state.parent_run_id, children)
        self.client.set_terminated(state.parent_run_id, status)
        logger.info("sweep parent run %s ended %s (%d job runs); compare them: python -m experiments.compare %s; in MLflow: %s",
                    state.parent_run_id, status, len(children), state.sweep_dir, view_link(ui_base(str(state.tracking_uri)), str(state.experiment_id),
                                                                                          state.parent_run_id))

    def _log_outcome(self, parent_run_id: str, children: list[Any]) -> None:
        """The sweep at a glance on its parent: jobs finished and failed, the objective's highest,
        lowest and mean (each job already logged its own objective there at its job number)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        objectives = [c.data.metrics["objective"] for c in children if math.isfinite(c.data.metrics.get("objective", math.nan))]
        values = {"jobs/finished": sum(c.info.status == "FINISHED" for c in children), "jobs/failed": sum(c.info.status != "FINISHED" for c in children)}
        if objectives:
            values.update({"objective/max": max(objectives), "objective/min": min(objectives), "objective/mean": sum(objectives) / len(objectives)})
        self.client.log_batch(parent_run_id, metrics=[Metric(k, float(v), now, 0) for k, v in values.items()])
