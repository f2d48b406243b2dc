"""What `python -m experiments.compare` writes and prints: the tables, the CSV files and plots
logged to the sweep's parent run, and the MLflow UI's compare view."""

from __future__ import annotations

import argparse
import csv
import logging
import math
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from experiments.compare import gap
from experiments.compare.load import DEFAULT_URI, Point, Sweep, _number, gain_points, load, locate
from experiments.compare.statistics import gain_ranking, gain_separation, points, separation, verdicts_disagree
from opd.cli import fail
from opd.config import ConfigError
from opd.tracking.ui import DEFAULT_UI, SAVED_VIEW_PREFIX, compare_link, sweep_view, ui_base, ui_command, view_link

logger = logging.getLogger("experiments.compare")


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
    on fresh samples and on the held-out samples, first and last, `sweep.speed`), compare_gap.png
    (the gap-closed curves) and compare_kl.png (the reverse-KL curves) when the jobs logged
    eval/gap_closed; else []."""
    curves = {point.label: runs for point in found if (runs := [c for run_id in point.run_ids if (c := gap.run_curve(client, run_id))])}
    if not curves:
        return []
    sweep.speed = gap.speed_rows(curves)
    kl = {point.label: runs for point in found if (runs := [c for run_id in point.run_ids if (c := gap.kl_curve(client, run_id))])}
    held_out = {point.label: runs for point in found if (runs := [ends for run_id in point.run_ids if (ends := gap.held_out_kl(client, run_id))])}
    changes = {point.label: gap.held_out_kl_change(point.kl_changes) for point in found}
    for row in sweep.speed:
        for r in [*gap.kl_rows(kl), *gap.held_out_kl_rows(held_out)]:
            if r["point"] == row["point"]:
                row.update({k: v for k, v in r.items() if k.startswith("reverse_kl")})
        row.update(changes.get(row["point"], {}))
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
    import experiments.compare

    parser = argparse.ArgumentParser(prog="python -m experiments.compare", description=(experiments.compare.__doc__ or "").split("\n")[0])
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
