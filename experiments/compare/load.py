"""A sweep as MLflow holds it: its parent run, its job runs as table rows, and each point's
per-item held-out changes (for `experiments.compare`)."""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiments.compare import gap
from opd.config import ConfigError

logger = logging.getLogger("experiments.compare")

DEFAULT_URI = "sqlite:///outputs/mlflow.db"


@dataclass
class Sweep:
    parent_run_id: str
    experiment_id: str
    tracking_uri: str
    swept: list[str]
    rows: list[dict[str, Any]]
    run_ids: list[str]
    # The objective's metric name, as the jobs recorded it (tag opd.objective).
    objective: str = "objective"
    # The points ranked by paired held-out gain (`gain_ranking`); empty when no job evaluated twice.
    ranking: list[dict[str, Any]] = field(default_factory=list)
    # The jobs' eval.confidence: the level of every interval of the ranking.
    confidence: float = 0.95
    # Per point, the optimiser steps to reach each level of gap closed to the teacher (experiments.compare.gap);
    # empty unless the jobs evaluated their teacher.
    speed: list[dict[str, Any]] = field(default_factory=list)

    def tie(self) -> float | None:
        """The objective every job reached, when two or more jobs all reached the same one (then
        the ranking's order means nothing); None otherwise."""
        values = {_number(row["objective"]) for row in self.rows}
        return values.pop() if len(self.rows) > 1 and len(values) == 1 and None not in values else None

    def ranked_by_its_own_reward(self) -> bool:
        """A sweep over reward weights ranked by a reward: the weights themselves scale the
        objective, so the ranking says nothing about the data."""
        return any(key.startswith("reward.weights.") for key in self.swept) and "reward" in self.objective


def _number(text: Any) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def locate(target: str, tracking_uri: str) -> tuple[str, str]:
    """(parent run id, tracking URI) from a sweep dir (its opd_sweep.json) or a run id, once the
    store is there to read; a ConfigError naming what was given otherwise."""
    from opd.sweep.state import read_state
    from opd.tracking.mlflow_run import absolute_tracking_uri

    path = Path(target)
    if path.is_dir():
        state = read_state(path)
        if state is None or not state.parent_run_id:
            raise ConfigError(f"{target}: not a tracked sweep directory (no opd_sweep.json with a parent run); give a sweep directory "
                              "(outputs/sweeps/<date>/<time>) or a sweep's parent run id", "target")
        return state.parent_run_id, readable_store(str(state.tracking_uri), f"{target}'s store")
    if path.exists() or not re.fullmatch(r"[\w-]+", target):
        raise ConfigError(f"{target}: no such sweep directory; give a sweep directory (outputs/sweeps/<date>/<time>) or a sweep's parent run id",
                          "target")
    return target, readable_store(absolute_tracking_uri(tracking_uri), "--tracking-uri")


def readable_store(uri: str, option: str) -> str:
    """`uri` once it is an MLflow store there to read (a sqlite file that exists, a server that
    answers as MLflow: `opd.tracking.store.check_store`); else a ConfigError naming `option`."""
    from opd.tracking.store import check_store, sqlite_path

    database = sqlite_path(uri)
    if uri.startswith("sqlite:") and database is not None and not database.is_file():
        raise ConfigError(f"{option}: no MLflow store at {database} ({uri})", option)
    try:
        check_store(uri, None)
    except ConfigError as err:
        raise ConfigError(f"{option}: {str(err).removeprefix('tracking.uri: ')}", option) from None
    return uri


def load(parent_run_id: str, tracking_uri: str) -> Sweep:
    """The sweep's children as table rows: name, status, swept values, objective, summary metrics."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri)
    try:
        parent = client.get_run(parent_run_id)
    except mlflow.exceptions.MlflowException as err:
        raise ConfigError(f"{parent_run_id}: no such run in {tracking_uri} ({err.message})", "target") from None
    swept = [key for key in parent.data.tags.get("opd.swept", "").split(",") if key]
    experiment_id = parent.info.experiment_id
    children = client.search_runs([experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'", max_results=10000)
    if not children:
        raise ConfigError(f"{parent_run_id}: run {parent_run_id} has no child runs; is it a sweep's parent run?", "target")
    rows = []
    for child in children:
        row: dict[str, Any] = {"run": child.info.run_name, "status": child.info.status}
        for key in swept:
            row[key] = child.data.params.get(key, "")
        metrics = child.data.metrics
        row["objective"] = metrics.get("objective", math.nan)
        for name in sorted(metrics):
            if name.startswith("summary/"):
                row[name.removeprefix("summary/")] = metrics[name]
        row["run_id"] = child.info.run_id
        rows.append(row)
    rows.sort(key=lambda r: (_number(r["objective"]) is None, -(_number(r["objective"]) or 0.0), r["run"] or ""))
    names = {child.data.tags.get("opd.objective") for child in children} - {None}
    return Sweep(parent_run_id, experiment_id, tracking_uri, swept, rows, [r["run_id"] for r in rows], ",".join(sorted(names)) or "objective")


def eval_rows(client: Any, run_id: str, tmp: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
    """(first, last) per-item rows of a run's evaluations (its `eval/step_<N>.jsonl` artifacts);
    None when it logged fewer than two."""
    files = sorted(a.path for a in client.list_artifacts(run_id, "eval") if re.fullmatch(r"eval/step_\d+\.jsonl", a.path))
    if len(files) < 2:
        return None

    def read(path: str) -> list[dict[str, Any]]:
        local = Path(client.download_artifacts(run_id, path, str(tmp / run_id)))
        return [json.loads(line) for line in local.read_text().splitlines() if line.strip()]

    return read(files[0]), read(files[-1])


@dataclass
class Point:
    """A sweep point (one arm) and, over its finished seeds, each held-out item's change of
    accuracy from the run's first evaluation to its last."""

    values: dict[str, str]
    run_ids: list[str]
    changes: list[dict[str, float]]
    first: list[dict[str, float]]
    # Each run's teacher evaluation per item (eval/teacher.jsonl), where it made one.
    teacher: list[dict[str, float]] = field(default_factory=list)
    # Each run's per-item change of the held-out reverse KL to the teacher, where it logged one.
    kl_changes: list[dict[str, float]] = field(default_factory=list)

    @property
    def label(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.values.items()) or "all runs"

    def items(self) -> list[str]:
        """Items every seed evaluated first and last, in the first seed's order."""
        return [item for item in self.changes[0] if all(item in c for c in self.changes[1:])]

    def mean_change(self) -> dict[str, float]:
        """{item: its change averaged over the seeds}."""
        return {item: sum(c[item] for c in self.changes) / len(self.changes) for item in self.items()}


def gain_points(sweep: Sweep, client: Any, tmp: Path) -> list[Point]:
    """The sweep's points (swept values other than `seed`) with the per-item changes of their
    finished runs that evaluated at least twice; a finished run without them is logged."""
    from opd.sinks.evaluation import item_accuracy, item_changes, item_kl

    others = [key for key in sweep.swept if key != "seed"]
    grouped: dict[tuple[str, ...], Point] = {}
    for row in sweep.rows:
        if row.get("status") != "FINISHED":
            continue
        rows = eval_rows(client, row["run_id"], tmp)
        if rows is None:
            logger.warning("run %s (%s) has fewer than two evaluations (eval/step_*.jsonl): left out of the paired ranking", row["run"], row["run_id"])
            continue
        values = {key: str(row.get(key, "")) for key in others}
        point = grouped.setdefault(tuple(values.values()), Point(values, [], [], []))
        point.run_ids.append(row["run_id"])
        point.changes.append(item_changes(*rows))
        point.first.append({r["item_id"]: a for r in rows[0] if (a := item_accuracy(r)) is not None})
        if kl := item_changes(*rows, item_kl):
            point.kl_changes.append(kl)
        if (ceiling := gap.teacher_items(client, row["run_id"], tmp)) is not None:
            point.teacher.append(ceiling)
    return list(grouped.values())
