"""MLflow tracking of one run: params, tags, per-step metrics, artifacts, final status.

The embedded default is a sqlite store under outputs/ with artifacts beside it. Params are the
flattened resolved config, each value cut to `max_param_chars` (the whole config is an artifact);
a run that ends with an exception is marked FAILED, Ctrl-C marks it KILLED.
"""

from __future__ import annotations

import logging
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

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


def _absolute_sqlite(uri: str) -> str:
    """sqlite:///relative/path -> sqlite:////abs/path, so the store is the same from any process."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        path = Path(uri[len(prefix) :]).resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        return prefix + str(path)
    return uri


class Tracker:
    """One MLflow run; use as a context manager around the work it records."""

    def __init__(self, uri: str, experiment: str, artifact_root: str, run_name: str | None, max_param_chars: int) -> None:
        import mlflow

        self.mlflow = mlflow
        self.uri = _absolute_sqlite(uri)
        self.max_param_chars = max_param_chars
        mlflow.set_tracking_uri(self.uri)
        client = mlflow.MlflowClient(self.uri)
        found = client.get_experiment_by_name(experiment)
        if found is None:
            location = artifact_root if "://" in artifact_root else Path(artifact_root).resolve().as_uri()
            self.experiment_id = client.create_experiment(experiment, artifact_location=location)
        else:
            self.experiment_id = found.experiment_id
        os.environ.pop("MLFLOW_RUN_ID", None)  # an inherited id would hijack the run
        self.run = mlflow.start_run(experiment_id=self.experiment_id, run_name=run_name)
        self.run_id = self.run.info.run_id
        logger.info("MLflow run %s in experiment %r (%s)", self.run_id, experiment, self.uri)

    def log_config(self, resolved: dict[str, Any], yaml_text: str) -> None:
        params = {}
        for key, value in flatten(resolved).items():
            text = str(value)
            params[key] = text if len(text) <= self.max_param_chars else text[: self.max_param_chars - 3] + "..."
        items = list(params.items())
        for start in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
            self.mlflow.log_params(dict(items[start : start + 100]))
        self.mlflow.log_text(yaml_text, "config.yaml")

    def set_tags(self, tags: dict[str, str]) -> None:
        base = {"python": platform.python_version(), "host": platform.node()}
        self.mlflow.set_tags({**base, **tags})

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.mlflow.log_metrics({k: float(v) for k, v in metrics.items()}, step=step)

    def log_artifact(self, path: Path, folder: str | None = None) -> None:
        self.mlflow.log_artifact(str(path), artifact_path=folder)

    def end(self, status: str) -> None:
        self.mlflow.end_run(status=status)
        logger.info("MLflow run %s ended %s", self.run_id, status)
