"""What MLflow's UI shows of the project's experiments, and the links the project prints into it.

- **The classic view.** MLflow 3 has two kinds of experiment: GenAI (traces, evaluations, judges,
  an assistant panel) and machine learning (the runs table, charts, params and metrics). An
  experiment records its kind in the tag `mlflow.experimentKind` (what the UI's own kind selector
  writes); the project creates its experiments as `custom_model_development`, MLflow's classic
  machine-learning kind. MLflow 3.17's UI takes the view from a switch of its own (top left,
  "GenAI" / "Model training", remembered per browser, GenAI for a browser that never chose) rather
  than from that tag, and from a link's `workflowType=machine_learning`: every link the project
  prints carries it, so it opens on the runs, not on an empty traces overview.
- **A sweep's view.** MLflow's runs table shows no params or metrics until one picks columns. A
  sweep saves a view of its jobs in its experiment, as MLflow keeps saved views (the UI's "Views"
  menu; an experiment tag `mlflow.sharedViewState.<key>` holding the view's name and state): the
  sweep's job runs only, the swept keys as parameter columns and the objective as a metric column,
  best objective first. `view_link` opens it.
"""

from __future__ import annotations

import json
import time
import urllib.parse

# The experiment tag that records an experiment's kind, and MLflow's classic machine-learning kind.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
CLASSIC_KIND = "custom_model_development"
# How MLflow's UI keeps a saved view: an experiment tag with this prefix and the view's key.
SAVED_VIEW_PREFIX = "mlflow.sharedViewState."
# Where `mlflow ui` serves unless told otherwise.
DEFAULT_UI = "http://127.0.0.1:5000"
# The link parameter that opens MLflow 3.17's machine-learning view.
_CLASSIC_VIEW = "workflowType=machine_learning"


def experiment_tags() -> dict[str, str]:
    """The tags of an experiment the project creates: its kind, classic machine learning."""
    return {EXPERIMENT_KIND_TAG: CLASSIC_KIND}


def _column(kind: str, name: str) -> str:
    """A runs-table column as the UI names it: params.`env.temperature`."""
    return f"{kind}.`{name}`"


def sweep_view(parent_run_id: str, name: str, swept: list[str], metrics: list[str]) -> tuple[str, str]:
    """(experiment tag key, value) of the saved view of a sweep's jobs: the runs whose parent is
    `parent_run_id`, columns the `swept` params then `metrics`, the first metric's best first;
    named `name` in the UI's Views menu. Its key is the parent run's id."""
    columns = [_column("params", key) for key in swept] + [_column("metrics", metric) for metric in metrics]
    state: dict[str, object] = {"selectedColumns": columns, "columnOrder": columns, "searchFilter": f"tags.mlflow.parentRunId = '{parent_run_id}'"}
    if metrics:
        state.update(orderByKey=_column("metrics", metrics[0]), orderByAsc=False)
    now = int(time.time() * 1000)
    view = {"name": name if len(name) <= 200 else name[:197] + "...", "createdAt": now, "updatedAt": now, "state": json.dumps(state)}
    return SAVED_VIEW_PREFIX + parent_run_id, json.dumps(view)


def ui_base(tracking_uri: str, ui: str | None = None) -> str:
    """The address of the UI of the store at `tracking_uri`: `ui` when given; an MLflow server
    serves its UI at its own address (the tracking URI, credentials left out); a store without a
    server (sqlite, files) has the UI that `mlflow ui` serves, by default `DEFAULT_UI`."""
    if ui:
        return ui.rstrip("/")
    if tracking_uri.startswith(("http://", "https://")):
        parts = urllib.parse.urlsplit(tracking_uri)
        return urllib.parse.urlunsplit((parts.scheme, parts.netloc.rsplit("@", 1)[-1], parts.path.rstrip("/"), "", ""))
    return DEFAULT_UI


def ui_command(tracking_uri: str, base: str) -> str | None:
    """The `mlflow ui` command that serves the store at `base` (None for an MLflow server, whose
    UI is already there)."""
    if tracking_uri.startswith(("http://", "https://")):
        return None
    parts = urllib.parse.urlsplit(base)
    default = base.rstrip("/") == DEFAULT_UI
    return f"mlflow ui --backend-store-uri {tracking_uri}" + ("" if default else f" --host {parts.hostname or '127.0.0.1'} --port {parts.port or 5000}")


def run_link(base: str, experiment_id: str, run_id: str) -> str:
    """A run's page, in the machine-learning view."""
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}?{_CLASSIC_VIEW}"


def view_link(base: str, experiment_id: str, key: str) -> str:
    """The runs table of an experiment in its saved view `key` (`sweep_view`'s tag key or its
    last part), in the machine-learning view."""
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?viewStateShareKey={key.removeprefix(SAVED_VIEW_PREFIX)}&{_CLASSIC_VIEW}"


def compare_link(base: str, experiment_id: str, run_ids: list[str]) -> str:
    """MLflow's compare view of `run_ids`, in the machine-learning view."""
    runs = urllib.parse.quote(json.dumps(run_ids, separators=(",", ":")))
    experiments = urllib.parse.quote(json.dumps([experiment_id], separators=(",", ":")))
    return f"{base.rstrip('/')}/#/compare-runs?runs={runs}&experiments={experiments}&{_CLASSIC_VIEW}"
