"""Compare the jobs of a sweep: `python -m experiments.compare <sweep dir | parent run id>`.

Prints a table of the sweep's job runs (swept params, objective, summary metrics; best objective
first), writes it as compare.csv with compare.png (objective against each swept parameter), logs
both to the sweep's parent run under compare/, and prints the MLflow UI address of the compare view.
When the sweep ran each point with several seeds (`sweep.seeds`, or `seed` swept), it also prints
each point's mean objective and spread over its seeds (compare_points.csv), best mean first, and
whether the best point is told apart from the next by more than that spread (Welch's t-test).
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import sys
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    """(parent run id, tracking URI) from a sweep dir (its opd_sweep.json) or a run id."""
    from opd.sweep.state import read_state
    from opd.tracking.mlflow_run import absolute_tracking_uri

    path = Path(target)
    if path.is_dir():
        state = read_state(path)
        if state is None or not state.parent_run_id:
            raise SystemExit(f"{path} is not a tracked sweep directory (no opd_sweep.json with a parent run)")
        return state.parent_run_id, str(state.tracking_uri)
    return target, absolute_tracking_uri(tracking_uri)


def load(parent_run_id: str, tracking_uri: str) -> Sweep:
    """The sweep's children as table rows: name, status, swept values, objective, summary metrics."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri)
    try:
        parent = client.get_run(parent_run_id)
    except mlflow.exceptions.MlflowException as err:
        raise SystemExit(f"no run {parent_run_id!r} in {tracking_uri}: {err.message}") from None
    swept = [key for key in parent.data.tags.get("opd.swept", "").split(",") if key]
    experiment_id = parent.info.experiment_id
    children = client.search_runs([experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'", max_results=10000)
    if not children:
        raise SystemExit(f"run {parent_run_id} has no child runs: is it a sweep's parent run?")
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


def points(sweep: Sweep) -> list[dict[str, Any]]:
    """One row per sweep point (the swept values other than `seed`) with its objective's mean,
    sample standard deviation, range and number of seeds, best mean first; [] unless `seed` is
    swept beside something else."""
    import statistics

    others = [key for key in sweep.swept if key != "seed"]
    if "seed" not in sweep.swept or not others:
        return []
    grouped: dict[tuple[str, ...], list[float]] = {}
    for row in sweep.rows:
        value = _number(row["objective"])
        if value is not None and row.get("status") == "FINISHED":
            grouped.setdefault(tuple(str(row.get(key, "")) for key in others), []).append(value)
    out = []
    for values, objectives in grouped.items():
        out.append({**dict(zip(others, values)), "seeds": len(objectives), "objective_mean": statistics.fmean(objectives),
                    "objective_sd": statistics.stdev(objectives) if len(objectives) > 1 else math.nan,
                    "objective_min": min(objectives), "objective_max": max(objectives), "objectives": objectives})
    out.sort(key=lambda r: -r["objective_mean"])
    return out


def separation(rows: list[dict[str, Any]]) -> str:
    """Whether the best point's objective is told apart from the runner-up's over their seeds."""
    if len(rows) < 2:
        return ""
    best, second = rows[0], rows[1]
    difference = best["objective_mean"] - second["objective_mean"]
    if best["seeds"] < 2 or second["seeds"] < 2:
        return f"best minus runner-up: {difference:+.4g}; one seed per point cannot tell it from noise (sweep.seeds=N)"
    from scipy.stats import ttest_ind

    p = float(ttest_ind(best["objectives"], second["objectives"], equal_var=False).pvalue)
    verdict = "told apart from the seeds' spread" if p < 0.05 else "NOT told apart from the seeds' spread"
    return (f"best minus runner-up: {difference:+.4g} (seed sd {best['objective_sd']:.3g} and {second['objective_sd']:.3g}); "
            f"Welch's t-test p = {p:.3g}: {verdict}")


def _columns(rows: list[dict[str, Any]]) -> list[str]:
    columns: list[str] = []
    for row in rows:
        columns += [key for key in row if key not in columns]
    return columns


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def table(rows: list[dict[str, Any]]) -> str:
    columns = [c for c in _columns(rows) if c != "run_id"]
    cells = [[_cell(row.get(c, "")) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join(lines)


def write_csv(rows: list[dict[str, Any]], path: Path) -> Path:
    columns = _columns(rows)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_plot(sweep: Sweep, path: Path) -> Path:
    """One panel per swept parameter: objective against its values (numeric axis when it can be)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sweep.swept or ["run"]
    fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 3.6), squeeze=False)
    for ax, key in zip(axes[0], keys):
        points = [(row.get(key, ""), _number(row["objective"])) for row in sweep.rows]
        points = [(x, y) for x, y in points if y is not None]
        if points and all(_number(x) is not None for x, _ in points):
            ax.scatter([_number(x) for x, _ in points], [y for _, y in points])
        else:
            labels = sorted({str(x) for x, _ in points})
            ax.scatter([labels.index(str(x)) for x, _ in points], [y for _, y in points])
            ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
        ax.set_xlabel(key)
        ax.set_ylabel("objective")
        ax.grid(alpha=0.3)
    fig.suptitle(f"sweep {sweep.parent_run_id[:8]}: objective per swept parameter")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


EVAL_CURVES = ("eval/sampled_accuracy", "eval/accuracy")


def write_eval_curves(sweep: Sweep, client: Any, path: Path) -> Path | None:
    """Every child's held-out accuracy against groups written, on one figure (None when no child
    evaluated during its run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves: dict[str, list[tuple[str, list[tuple[int, float]]]]] = {name: [] for name in EVAL_CURVES}
    for row in sweep.rows:
        for name in EVAL_CURVES:
            points = sorted((m.step, m.value) for m in client.get_metric_history(row["run_id"], name))
            if len(points) > 1:
                curves[name].append((str(row["run"]), points))
    shown = [name for name in EVAL_CURVES if curves[name]]
    if not shown:
        return None
    fig, axes = plt.subplots(1, len(shown), figsize=(5.5 * len(shown), 3.8), squeeze=False)
    for ax, name in zip(axes[0], shown):
        for label, points in curves[name]:
            ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label=label)
        ax.set_xlabel("groups written")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="best")
    fig.suptitle(f"sweep {sweep.parent_run_id[:8]}: held-out accuracy during each run")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def ui_address(sweep: Sweep, host: str) -> str:
    """The MLflow UI's compare view of the sweep's runs."""
    runs = urllib.parse.quote(json.dumps(sweep.run_ids, separators=(",", ":")))
    experiments = urllib.parse.quote(json.dumps([sweep.experiment_id], separators=(",", ":")))
    return f"{host.rstrip('/')}/#/compare-runs?runs={runs}&experiments={experiments}"


def compare(target: str, tracking_uri: str = DEFAULT_URI, out_dir: Path | None = None, ui: str = "http://127.0.0.1:5000") -> tuple[Sweep, Path, Path, str]:
    """Build the table, CSV and plot, log them to the parent run; return (sweep, csv, png, UI address)."""
    import mlflow

    parent_run_id, uri = locate(target, tracking_uri)
    sweep = load(parent_run_id, uri)
    if out_dir is None:
        out_dir = Path(target) if Path(target).is_dir() else Path("outputs/compare") / parent_run_id
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = write_csv(sweep.rows, out_dir / "compare.csv")
    per_point = points(sweep)
    points_path = write_csv([{k: v for k, v in row.items() if k != "objectives"} for row in per_point], out_dir / "compare_points.csv") if per_point else None
    png_path = write_plot(sweep, out_dir / "compare.png")
    client = mlflow.MlflowClient(uri)
    curves = write_eval_curves(sweep, client, out_dir / "compare_eval.png")
    for path in (csv_path, png_path, curves, points_path):
        if path is not None:
            client.log_artifact(parent_run_id, str(path), artifact_path="compare")
    if sweep.ranked_by_its_own_reward():
        logger.warning("this sweep varies reward weights and is ranked by %s, a reward those weights scale: the ranking says nothing about "
                       "the data. Rank by held-out accuracy: trainer=local eval.every=N (the default objective then), or sweep.objective=accuracy.",
                       sweep.objective)
    return sweep, csv_path, png_path, ui_address(sweep, ui)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.compare", description=__doc__.split("\n")[0])
    parser.add_argument("target", help="a sweep directory (outputs/sweeps/<date>/<time>) or a sweep's parent run id")
    parser.add_argument("--tracking-uri", default=DEFAULT_URI, help="MLflow store for a run id (a sweep dir knows its own)")
    parser.add_argument("--out", type=Path, default=None, help="where compare.csv/png go (default: the sweep dir)")
    parser.add_argument("--ui", default="http://127.0.0.1:5000", help="address of the MLflow UI (`mlflow ui` serves on port 5000)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    sweep, csv_path, png_path, address = compare(args.target, args.tracking_uri, args.out, args.ui)
    sys.stdout.write(table(sweep.rows) + "\n\n")
    if (tie := sweep.tie()) is not None:
        sys.stdout.write(f"every job tied: {sweep.objective} = {tie:.4g} in all {len(sweep.rows)}, so the order above means nothing; "
                         "run more steps or evaluate (eval.every=N), or rank by another metric (sweep.objective=...)\n\n")
    per_point = points(sweep)
    if per_point:
        sys.stdout.write("per sweep point, over its seeds:\n" + table([{k: v for k, v in r.items() if k != "objectives"} for r in per_point]) + "\n")
        sys.stdout.write(separation(per_point) + "\n\n")
    sys.stdout.write(f"ranked by: {sweep.objective}\ntable: {csv_path}\nplot:  {png_path}\n(logged to the parent run {sweep.parent_run_id} under compare/, with compare_eval.png when the runs evaluated)\n\n")
    sys.stdout.write(f"MLflow UI:  mlflow ui --backend-store-uri {sweep.tracking_uri}\ncompare view: {address}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
