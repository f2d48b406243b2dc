"""What a sweep's numbers say: each point's mean and spread over its seeds, the ranking by paired
held-out gain, and whether the best is told apart (for `experiments.compare`)."""

from __future__ import annotations

import math
from typing import Any

from experiments.compare import gap
from experiments.compare.load import Point, Sweep, _number


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


GAIN_COLUMNS = ("gain", "gain_low", "gain_high", "p")


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
