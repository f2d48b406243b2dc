"""Sweeps (`-m`): one MLflow parent run per sweep, one inference server shared by its jobs.

`SweepCallback` runs in the launching process. At the start of a sweep it creates the parent run
and, with server=local, starts one vLLM server for all jobs; both are written to a small JSON file
in the sweep directory. Jobs read that file, not the launcher's memory, so the wiring holds for
jobs in other processes (joblib) or on other machines that share the directory (submitit).

Hydra calls `on_multirun_end` only when every job succeeded; a job that raises skips it. The parent
run is therefore also closed by an exit hook: FINISHED only after a complete sweep in which every
child finished, FAILED otherwise, and children still RUNNING (a killed job) are marked FAILED.
"""

from __future__ import annotations

import atexit
import copy
import json
import os
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

logger = logging.getLogger(__name__)

STATE_FILE = "opd_sweep.json"
# Server settings a job must share with the sweep's server to use it (max_logprobs may be lower).
_SERVER_KEYS = ("model", "dtype", "max_model_len", "tool_call_parser", "cpu_kv_cache_gib", "enforce_eager", "extra_args")


@dataclass
class SweepState:
    """What the jobs of a sweep need from the launching process; stored as JSON in the sweep dir."""

    sweep_dir: str
    # Override keys the sweep varies (command-line sweeps and hydra.sweeper.params).
    swept: list[str]
    # MLflow parent run (None when tracking is off).
    parent_run_id: Optional[str] = None
    tracking_uri: Optional[str] = None
    experiment_id: Optional[str] = None
    # The shared server's /v1 URLs and the settings it was started with (None: each job starts its own).
    server_urls: Optional[list[str]] = None
    server_settings: dict[str, Any] = field(default_factory=dict)


def write_state(state: SweepState) -> Path:
    path = Path(state.sweep_dir) / STATE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(state), indent=2))
    tmp.replace(path)
    return path


def read_state(sweep_dir: str | Path) -> SweepState | None:
    path = Path(sweep_dir) / STATE_FILE
    if not path.is_file():
        return None
    return SweepState(**json.loads(path.read_text()))


def swept_keys(task_overrides: list[str], sweeper_params: dict[str, Any] | None) -> list[str]:
    """Keys a sweep varies: `a=1,2` / `a=range(..)` on the command line, plus the sweeper's params."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(task_overrides))
    keys = [o.key_or_group for o in parsed if o.is_sweep_override()]
    keys += [str(k) for k in (sweeper_params or {}) if str(k) not in keys]
    return keys


def job_label(job_overrides: list[str], swept: list[str]) -> dict[str, str]:
    """{key: value} of a job's overrides for the swept keys (key as given on the command line)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    values: dict[str, str] = {}
    for override in OverridesParser.create().parse_overrides(list(job_overrides)):
        if override.key_or_group in swept:
            values[override.key_or_group] = override.get_value_element_as_str()
    return values


def run_name(values: dict[str, str]) -> str:
    """`correctness=0.7,efficiency=0.1`: last key component, or the full key where two collide."""
    short = [key.rsplit(".", 1)[-1].rsplit("/", 1)[-1] for key in values]
    names = [s if short.count(s) == 1 else key for s, key in zip(short, values)]
    return ",".join(f"{name}={_short_value(value)}" for name, value in zip(names, values.values())) or "job"


def _short_value(value: str) -> str:
    """Optuna's 0.6841694527491273 -> 0.6842 in names (the param keeps every digit)."""
    if "." in value and len(value) > 6:
        try:
            return f"{float(value):.4g}"
        except ValueError:
            pass
    return value


def server_settings(server: Any) -> dict[str, Any]:
    return {key: (list(value) if isinstance(value, (list, tuple)) else value) for key, value in ((k, getattr(server, k)) for k in _SERVER_KEYS)}


def shared_server_for(state: SweepState | None, server: Any) -> list[str] | None:
    """The sweep's server URLs if this job's server=local settings match them, else None."""
    if state is None or not state.server_urls:
        return None
    mine = server_settings(server)
    theirs = {k: v for k, v in state.server_settings.items() if k != "max_logprobs"}
    if mine != theirs or server.max_logprobs > state.server_settings.get("max_logprobs", 0):
        logger.warning("this job's server settings differ from the sweep's shared server; starting its own (%s vs %s)", mine, state.server_settings)
        return None
    return list(state.server_urls)


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
        params = OmegaConf.to_container(hydra_cfg.sweeper.params, resolve=False) if OmegaConf.select(hydra_cfg, "sweeper.params") else None
        state = SweepState(sweep_dir=str(sweep_dir), swept=swept_keys(list(hydra_cfg.overrides.task), params))
        job_cfg = copy.deepcopy(config)
        with read_write(job_cfg), open_dict(job_cfg):  # what Hydra does to make a job's config
            del job_cfg["hydra"]
            job_cfg.output_dir = str(sweep_dir)
        typed = validate(job_cfg)
        # Registered before anything is created, so a failure below still closes what exists.
        atexit.register(self._finish, completed=False)
        self.state = state
        if typed.tracking.enabled:
            self._open_parent(typed, state, list(hydra_cfg.overrides.task))
        launcher = str(OmegaConf.select(hydra_cfg, "launcher._target_") or "")
        if typed.server.kind == "local" and typed.sweep.share_server:
            if "submitit" in launcher:
                logger.warning("sweep.share_server: jobs on other machines cannot reach a loopback server; each job starts its own")
            else:
                self._start_server(typed, state)
        path = write_state(state)
        logger.info("sweep state in %s (swept: %s)", path, ", ".join(state.swept) or "nothing")

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._finish(completed=True)

    def _open_parent(self, typed: Any, state: SweepState, overrides: list[str]) -> None:
        import mlflow

        from opd.tracking import absolute_tracking_uri, ensure_experiment, system_tags

        uri = absolute_tracking_uri(typed.tracking.uri)
        self.client = mlflow.MlflowClient(uri)
        experiment_id = ensure_experiment(self.client, typed.tracking.experiment, typed.tracking.artifact_root)
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
