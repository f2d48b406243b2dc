"""Compare the jobs of a sweep: `python -m experiments.compare <sweep dir | parent run id>`.

Prints a table of the sweep's job runs (swept params, objective, summary metrics; best objective
first), writes it as compare.csv with compare.png (objective against each swept parameter), logs
both to the sweep's parent run under compare/, and prints links into the MLflow UI at the store's own
address (the tracking server's; `mlflow ui`'s for a sqlite store; `--ui` for another): the jobs'
runs with the swept keys as columns (the sweep's saved view, `opd.tracking.ui`), the compare view.
When the sweep ran each point with several seeds (`sweep.seeds`, or `seed` swept), it also prints
each point's mean objective and spread over its seeds (compare_points.csv), best mean first, and
whether the best point is told apart from the next by more than that spread (Welch's t-test).
When the jobs evaluated during their runs (eval.every), it ranks the points (arms, e.g.
experiment=opd_vs_grpo's) by their paired held-out gain with its interval, from the per-item rows
the jobs logged (compare_gain.csv), says whether the best point is told apart from each other on
the same items, and plots each point's eval curve, the mean over its seeds (compare_gain.png).
When the verdict over seeds and the paired one over items differ, it says why and what settles it.
When the jobs evaluated their teacher (teacher=model, eval.teacher), the ranking also gives each
point's gap to the teacher closed with its interval, and compare_gap.png / compare_gap.csv its
curve against optimiser steps, rollouts and wall time and the steps it needed to reach each level
(`experiments.gap`), with how many times fewer steps than the grpo arm.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import re
import sys
import tempfile
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiments import gap
from opd.cli import fail
from opd.config import ConfigError
from opd.tracking.ui import DEFAULT_UI, SAVED_VIEW_PREFIX, compare_link, sweep_view, ui_base, ui_command, view_link

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
    # Per point, the optimiser steps to reach each level of gap closed to the teacher (experiments.gap);
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


def _seed_p(rows: list[dict[str, Any]]) -> float | None:
    """Welch's t-test p of the best point's objectives against the runner-up's over their seeds
    (None: fewer than two points, or a point with one seed)."""
    if len(rows) < 2 or rows[0]["seeds"] < 2 or rows[1]["seeds"] < 2:
        return None
    from scipy.stats import ttest_ind

    return float(ttest_ind(rows[0]["objectives"], rows[1]["objectives"], equal_var=False).pvalue)


def separation(rows: list[dict[str, Any]], confidence: float = 0.95) -> str:
    """Whether the best point's objective is told apart from the runner-up's over their seeds
    (Welch's p below 1 - `confidence`, the level of the paired intervals too)."""
    if len(rows) < 2:
        return ""
    best, second = rows[0], rows[1]
    difference = best["objective_mean"] - second["objective_mean"]
    p = _seed_p(rows)
    if p is None:
        return f"best minus runner-up: {difference:+.4g}; one seed per point cannot tell it from noise (sweep.seeds=N)"
    verdict = "told apart from the seeds' spread" if p < 1 - confidence else "NOT told apart from the seeds' spread"
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


GAIN_COLUMNS = ("gain", "gain_low", "gain_high", "p")


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
    from opd.sinks.evaluation import item_accuracy, item_changes

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
        if (ceiling := gap.teacher_items(client, row["run_id"], tmp)) is not None:
            point.teacher.append(ceiling)
    return list(grouped.values())


def gain_ranking(points_: list[Point], confidence: float = 0.95) -> list[dict[str, Any]]:
    """One row per point: its paired held-out gain (the mean over items of each item's change,
    averaged over the point's seeds) with its bootstrap interval over items and one-sided
    Wilcoxon p, its seeds and items, and the mean first and final accuracy; best gain first.
    With one seed this is the run's own `summary/eval_paired_*`."""
    from opd.sinks.evaluation import paired_statistics

    rows = []
    for point in points_:
        change = point.mean_change()
        stats = paired_statistics(list(change.values()), confidence)
        firsts = {item: sum(f[item] for f in point.first) / len(point.first) for item in change}
        first = statistics_mean(list(firsts.values()))
        ceiling = {}
        if point.teacher and len(point.teacher) == len(point.run_ids):
            ceiling = gap.gap_columns(change, firsts, {item: sum(t.get(item, math.nan) for t in point.teacher) / len(point.teacher)
                                                       for item in change}, stats)
        rows.append({**point.values, "seeds": len(point.run_ids), "items": len(change), **{k: stats[k] for k in GAIN_COLUMNS},
                     "first_accuracy": first, "final_accuracy": first + stats["gain"], **ceiling, "_point": point})
    rows.sort(key=lambda r: -r["gain"])
    return rows


def statistics_mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def gain_separation(ranking: list[dict[str, Any]], confidence: float = 0.95) -> list[str]:
    """Whether the best point stands apart from each other: do the gains' intervals overlap, and
    the paired difference of the two points' per-item changes on their common items (seed means)
    with its bootstrap interval; told apart when that interval lies above 0."""
    if len(ranking) < 2:
        return []
    best = ranking[0]
    lines = [f"best: {best['_point'].label}, paired gain {best['gain']:+.4f} [{best['gain_low']:+.4f}, {best['gain_high']:+.4f}] "
             f"over {best['items']} items, {best['seeds']} seed(s)"]
    apart: list[bool] = []
    for other in ranking[1:]:
        stats = _paired_difference(best, other, confidence)
        overlap = best["gain_low"] <= other["gain_high"]
        told = stats["gain_low"] > 0
        apart.append(told)
        lines.append(f"  vs {other['_point'].label} ({other['gain']:+.4f} [{other['gain_low']:+.4f}, {other['gain_high']:+.4f}]): intervals "
                     f"{'overlap' if overlap else 'do not overlap'}; best minus it, paired on {int(stats['items'])} items: "
                     f"{stats['gain']:+.4f} [{stats['gain_low']:+.4f}, {stats['gain_high']:+.4f}]: {'told apart' if told else 'NOT told apart'}")
    close = [other["_point"].label for other, told in zip(ranking[1:], apart) if not told]
    lines.append("the best is told apart from every other" if not close else
                 f"the best is NOT told apart from {', '.join(close)}: which of them is best is not established")
    return lines


def _paired_difference(best: dict[str, Any], other: dict[str, Any], confidence: float) -> dict[str, float]:
    """`paired_statistics` of best's per-item change minus other's (seed means) on their common items."""
    from opd.sinks.evaluation import paired_statistics

    mine, theirs = best["_point"].mean_change(), other["_point"].mean_change()
    return paired_statistics([mine[item] - theirs[item] for item in mine if item in theirs], confidence)


def verdicts_disagree(per_point: list[dict[str, Any]], ranking: list[dict[str, Any]], confidence: float = 0.95) -> str:
    """Why the two verdicts on a seeded sweep differ, when they do ('' when they agree or only
    one was given). Over seeds, n is the seeds: it sees how much another training seed moves the
    result but, with few seeds, tells little apart. Paired over items, n is the held-out items,
    each averaged over the seeds: it sees the items' noise but not the seeds' spread."""
    if len(per_point) < 2 or len(ranking) < 2:
        return ""
    p = _seed_p(per_point)
    if p is None:
        return ""
    swept = list(ranking[0]["_point"].values)
    best, runner_up = (",".join(f"{key}={row.get(key, '')}" for key in swept) for row in per_point[:2])
    if best != ranking[0]["_point"].label:
        return (f"the two rankings name different bests ({best} over seeds, {ranking[0]['_point'].label} paired over items): "
                "their objectives differ (an item left out of the pairing, or another objective); the paired one compares like with like")
    # The verdict over seeds is about the runner-up by mean objective: the paired one about the same point.
    other = next((row for row in ranking[1:] if row["_point"].label == runner_up), None)
    if other is None:
        return ""
    seeds_told = p < 1 - confidence
    items_told = _paired_difference(ranking[0], other, confidence)["gain_low"] > 0
    if seeds_told == items_told:
        return ""
    seeds = min(per_point[0]["seeds"], per_point[1]["seeds"])
    if items_told:
        return (f"the verdicts differ: paired over {ranking[0]['items']} items the best is told apart, over {seeds} seeds it is not. "
                "These runs differ beyond the items' noise, but the seeds' own spread is barely measured; whether another "
                "training seed keeps the order is open: more seeds (sweep.seeds=N) settle it")
    return (f"the verdicts differ: over {seeds} seeds the best is told apart, paired over {ranking[0]['items']} items it is not. "
            "The seeds agree closely, but the difference is small against the held-out items' noise: "
            "a larger held-out split (more items) settles it")


def mean_curves(points_: list[Point], client: Any) -> dict[str, tuple[str, list[int], list[float], list[float], list[float]]]:
    """{point label: (metric, steps, mean, min, max)}: each point's held-out sampled accuracy
    (greedy where no run sampled) at the steps all its seeds evaluated, mean and range over them."""
    out = {}
    for point in points_:
        for name in EVAL_CURVES:
            histories = [{m.step: m.value for m in client.get_metric_history(run_id, name)} for run_id in point.run_ids]
            steps = sorted(set.intersection(*(set(h) for h in histories)))
            if len(steps) > 1:
                out[point.label] = (name, steps, [sum(h[s] for h in histories) / len(histories) for s in steps],
                                    [min(h[s] for h in histories) for s in steps], [max(h[s] for h in histories) for s in steps])
                break
    return out


def write_gain_curves(points_: list[Point], ranking: list[dict[str, Any]], client: Any, path: Path) -> Path | None:
    """One figure, one line per point (`mean_curves`: the mean over its seeds, their range as a
    band), labelled with its paired gain and interval; None when no run logged a curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = mean_curves(points_, client)
    if not curves:
        return None
    gains = {r["_point"].label: r for r in ranking}
    seeds = sorted({len(p.run_ids) for p in points_})
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    ranked = [r["_point"].label for r in ranking if r["_point"].label in curves]
    for label in ranked + [label for label in curves if label not in ranked]:  # the legend reads best first
        _, steps, mean, low, high = curves[label]
        row = gains.get(label)
        text = label + (f"  {row['gain']:+.3f} [{row['gain_low']:+.3f}, {row['gain_high']:+.3f}]" if row else "")
        (line,) = ax.plot(steps, mean, marker="o", label=text)
        if max(seeds) > 1:
            ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.2)
    ax.set_xlabel("groups written")
    ax.set_ylabel(" / ".join(sorted({name for name, *_ in curves.values()})))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best", title="paired gain [interval]", title_fontsize=8)
    band = " (band: their range)" if max(seeds) > 1 else ""
    ax.set_title(f"held-out accuracy per sweep point, mean over {'/'.join(map(str, seeds))} seed(s){band}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def gap_outputs(sweep: Sweep, found: list[Point], client: Any, out_dir: Path) -> list[Path]:
    """compare_gap.csv (per point: optimiser steps to each level of gap closed and the reverse KL
    on fresh samples, first and last, `sweep.speed`), compare_gap.png (the gap-closed curves) and
    compare_kl.png (the reverse-KL curves) when the jobs logged eval/gap_closed; else []."""
    curves = {point.label: runs for point in found if (runs := [c for run_id in point.run_ids if (c := gap.run_curve(client, run_id))])}
    if not curves:
        return []
    sweep.speed = gap.speed_rows(curves)
    kl = {point.label: runs for point in found if (runs := [c for run_id in point.run_ids if (c := gap.kl_curve(client, run_id))])}
    for row in sweep.speed:
        row.update({k: v for r in gap.kl_rows(kl) if r["point"] == row["point"] for k, v in r.items() if k.startswith("reverse_kl")})
    gaps = {row["_point"].label: row for row in sweep.ranking}
    written = [write_csv(sweep.speed, out_dir / "compare_gap.csv"), gap.write_gap_curves(curves, gaps, out_dir / "compare_gap.png"),
               gap.write_kl_curves(kl, out_dir / "compare_kl.png")]
    return [path for path in written if path is not None]


def _public(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows without their private (`_`) fields, for tables and CSV files."""
    return [{k: v for k, v in row.items() if not k.startswith("_")} for row in rows]


def compare(target: str, tracking_uri: str = DEFAULT_URI, out_dir: Path | None = None, ui: str | None = None) -> tuple[Sweep, Path, Path, str]:
    """Build the table, CSV and plot, log them to the parent run; return (sweep, csv, png, the
    MLflow UI's address: `ui`, or the store's own, `opd.tracking.ui.ui_base`)."""
    parent_run_id, uri = locate(target, tracking_uri)  # before MLflow's import: a bad target fails in a second
    import mlflow

    sweep = load(parent_run_id, uri)
    client = mlflow.MlflowClient(uri)
    view_key = SAVED_VIEW_PREFIX + parent_run_id
    if view_key not in client.get_experiment(sweep.experiment_id).tags:  # a sweep from before saved views: its link must open
        client.set_experiment_tag(sweep.experiment_id, *sweep_view(parent_run_id, client.get_run(parent_run_id).info.run_name or parent_run_id,
                                                                   sweep.swept, ["objective"]))
    if out_dir is None:
        out_dir = Path(target) if Path(target).is_dir() else Path("outputs/compare") / parent_run_id
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = write_csv(sweep.rows, out_dir / "compare.csv")
    per_point = points(sweep)
    points_path = write_csv([{k: v for k, v in row.items() if k != "objectives"} for row in per_point], out_dir / "compare_points.csv") if per_point else None
    png_path = write_plot(sweep, out_dir / "compare.png")
    curves = write_eval_curves(sweep, client, out_dir / "compare_eval.png")
    gain_csv = gain_png = None
    gap_files: list[Path] = []
    if any(_number(row.get("eval_paired_gain")) is not None for row in sweep.rows):
        sweep.confidence = float(client.get_run(sweep.run_ids[0]).data.params.get("eval.confidence", 0.95))
        with tempfile.TemporaryDirectory(prefix="opd-compare-") as tmp:
            found = gain_points(sweep, client, Path(tmp))
        sweep.ranking = gain_ranking(found, sweep.confidence)
        if sweep.ranking:
            gain_csv = write_csv(_public(sweep.ranking), out_dir / "compare_gain.csv")
            gain_png = write_gain_curves(found, sweep.ranking, client, out_dir / "compare_gain.png")
        gap_files = gap_outputs(sweep, found, client, out_dir)
    for path in (csv_path, png_path, curves, points_path, gain_csv, gain_png, *gap_files):
        if path is not None:
            client.log_artifact(parent_run_id, str(path), artifact_path="compare")
    if sweep.ranked_by_its_own_reward():
        logger.warning("this sweep varies reward weights and is ranked by %s, a reward those weights scale: the ranking says nothing about "
                       "the data. Rank by held-out accuracy: trainer=local eval.every=N (the default objective then), or sweep.objective=accuracy.",
                       sweep.objective)
    return sweep, csv_path, png_path, ui_base(uri, ui)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.compare", description=__doc__.split("\n")[0])
    parser.add_argument("target", help="a sweep directory (outputs/sweeps/<date>/<time>) or a sweep's parent run id")
    parser.add_argument("--tracking-uri", default=DEFAULT_URI, help="MLflow store for a run id (a sweep dir knows its own)")
    parser.add_argument("--out", type=Path, default=None, help="where compare.csv/png go (default: the sweep dir)")
    parser.add_argument("--ui", default=None, help="address of the MLflow UI, for its links (default: the tracking server's own address, "
                        f"or where `mlflow ui` serves a sqlite store: {DEFAULT_UI})")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.ui and not re.match(r"https?://[^/\s]+", args.ui):
        fail(f"--ui={args.ui!r}: give the UI's address, such as http://127.0.0.1:5000")
    try:
        sweep, csv_path, png_path, address = compare(args.target, args.tracking_uri, args.out, args.ui)
    except ConfigError as err:
        fail(str(err))
    sys.stdout.write(table(sweep.rows) + "\n\n")
    if (tie := sweep.tie()) is not None:
        sys.stdout.write(f"every job tied: {sweep.objective} = {tie:.4g} in all {len(sweep.rows)}, so the order above means nothing; "
                         "run more steps or evaluate (eval.every=N), or rank by another metric (sweep.objective=...)\n\n")
    per_point = points(sweep)
    if per_point:
        sys.stdout.write("per sweep point, over its seeds:\n" + table([{k: v for k, v in r.items() if k != "objectives"} for r in per_point]) + "\n")
        sys.stdout.write(separation(per_point, sweep.confidence) + "\n\n")
    if sweep.ranking:
        sys.stdout.write("ranked by paired held-out gain (each item's accuracy at the run's last evaluation minus its first, on the same "
                         "items and seeded samples; the mean over seeds per item):\n" + table(_public(sweep.ranking)) + "\n")
        sys.stdout.write("\n".join(gain_separation(sweep.ranking, sweep.confidence)) + "\n")
        if why := verdicts_disagree(per_point, sweep.ranking, sweep.confidence):
            sys.stdout.write(why + "\n")
        sys.stdout.write(f"(compare_gain.csv; the points' eval curves in compare_gain.png, in {csv_path.parent})\n\n")
    if sweep.speed:
        sys.stdout.write("gap to the teacher closed, mean over seeds, and the optimiser steps its mean curve needed to reach each level:\n"
                         + table(sweep.speed) + "\n")
        if (baseline := gap.baseline_label([row["point"] for row in sweep.speed])) is not None:
            sys.stdout.write("\n".join(gap.speedups(sweep.speed, baseline)) + "\n")
        sys.stdout.write("(compare_gap.csv; the curves against optimiser steps, rollouts and wall time in compare_gap.png, the reverse KL "
                         "to the teacher on fresh samples in compare_kl.png)\n\n")
    sys.stdout.write(f"ranked by: {sweep.objective}\ntable: {csv_path}\nplot:  {png_path}\n(logged to the parent run {sweep.parent_run_id} under compare/, with compare_eval.png when the runs evaluated)\n\n")
    serve = ui_command(sweep.tracking_uri, address)
    sys.stdout.write(f"MLflow UI:  {address}" + (f" (serve it: {serve})" if serve else " (the tracking server's)") + "\n"
                     f"the jobs' runs, swept keys as columns: {view_link(address, sweep.experiment_id, sweep.parent_run_id)}\n"
                     f"compare view: {compare_link(address, sweep.experiment_id, sweep.run_ids)}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
