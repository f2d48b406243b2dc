"""The plain OPD experiment's result: per arm and learning rate, the share of the held-out gap to
the teacher closed and the per-token reverse KL to the teacher on the held-out samples, from each
run's first evaluation to its last, with 95% intervals from a bootstrap over the held-out items
(resampled together for every seed of an arm, so each interval is paired on the items).

    python -m experiments.opd_plain.report results/ --out results/report.md
"""

from __future__ import annotations

import argparse
import json
import logging
import random
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

logger = logging.getLogger(__name__)

# Bootstrap resamples of the items.
RESAMPLES = 2000


# Levels of gap closed at which the optimiser steps each arm needed are reported.
LEVELS = (0.1, 0.2)


@dataclass
class Run:
    """One arm, learning rate and seed: its evaluations, in order."""

    arm: str
    lr: float
    seed: int
    evals: list[dict[str, Any]]

    @property
    def first(self) -> dict[str, Any]:
        return self.evals[0]

    @property
    def last(self) -> dict[str, Any]:
        return self.evals[-1]


def load_runs(results: Path) -> tuple[list[Run], dict[str, Any]]:
    """Every run's first and last evaluation, and the teacher's evaluation (the ceiling)."""
    runs = []
    for path in sorted(results.glob("*.jsonl")):
        evals = [e for e in map(json.loads, path.read_text().splitlines()) if e.get("kind") == "eval"]
        if len(evals) >= 2:
            runs.append(Run(evals[0]["arm"], evals[0]["lr"], evals[0]["seed"], evals))
        else:
            logger.warning("%s: fewer than two evaluations, left out", path.name)
    teachers = sorted(results.glob("*.teacher.json"))
    if not teachers:
        raise SystemExit(f"{results}: no teacher evaluation (*.teacher.json): the gap to the teacher is unknown")
    return runs, json.loads(teachers[0].read_text())


def _gap(runs: Sequence[Run], teacher: dict[str, Any], items: Sequence[int]) -> float:
    """Gap closed on `items`, pooled over the runs: (end - start) / (teacher - start)."""
    start = sum(r.first["item_correct"][i] for r in runs for i in items)
    end = sum(r.last["item_correct"][i] for r in runs for i in items)
    ceiling = len(runs) * sum(teacher["item_correct"][i] for i in items)
    return (end - start) / (ceiling - start) if ceiling != start else 0.0


def gap_curve(runs: Sequence[Run], teacher: dict[str, Any]) -> list[tuple[int, float]]:
    """(optimiser step, gap closed pooled over the runs) at each step every run evaluated."""
    steps = sorted(set.intersection(*({e["step"] for e in r.evals} for r in runs)))
    items = range(len(teacher["item_correct"]))
    curve = []
    for step in steps:
        at = [Run(r.arm, r.lr, r.seed, [r.first, next(e for e in r.evals if e["step"] == step)]) for r in runs]
        curve.append((step, _gap(at, teacher, items)))
    return curve


def steps_to(curve: list[tuple[int, float]], level: float) -> float | None:
    """The first step at which `curve` reaches `level` (linear between evaluations), or None."""
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if y0 >= level:
            return x0
        if y1 >= level:  # y0 < level <= y1
            return x0 + (level - y0) * (x1 - x0) / (y1 - y0)
    return None


def _kl(evaluation: dict[str, Any], runs_items: Sequence[int]) -> float:
    return sum(evaluation["item_kl_exact"][i] for i in runs_items) / max(1.0, sum(evaluation["item_tokens"][i] for i in runs_items))


def _kl_change(runs: Sequence[Run], items: Sequence[int]) -> tuple[float, float]:
    """The reverse KL per token at the first and last evaluation, pooled over the runs."""
    start = sum(_kl(r.first, items) for r in runs) / len(runs)
    end = sum(_kl(r.last, items) for r in runs) / len(runs)
    return start, end


def _interval(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return ordered[int(0.025 * len(ordered))], ordered[int(0.975 * len(ordered)) - 1]


def summarise(runs: list[Run], teacher: dict[str, Any], seed: int = 0) -> list[dict[str, Any]]:
    """One row per arm and learning rate, with bootstrap intervals over the held-out items."""
    rng = random.Random(seed)
    by_arm: dict[tuple[str, float], list[Run]] = defaultdict(list)
    for run in runs:
        by_arm[(run.arm, run.lr)].append(run)
    n = len(teacher["item_correct"])
    draws = [[rng.randrange(n) for _ in range(n)] for _ in range(RESAMPLES)]
    everything = list(range(n))
    rows = []
    for (arm, lr), group in sorted(by_arm.items()):
        kl_start, kl_end = _kl_change(group, everything)
        gaps = [_gap(group, teacher, d) for d in draws]
        falls = [(lambda s, e: e - s)(*_kl_change(group, d)) for d in draws]
        curve = gap_curve(group, teacher)
        rows.append({
            "arm": arm, "lr": lr, "seeds": sorted(r.seed for r in group), "gap_curve": curve,
            **{f"steps_to_{level:g}": steps_to(curve, level) for level in LEVELS},
            "steps": [r.last["step"] for r in group], "rollouts": [r.last["rollouts"] for r in group],
            "sampled_start": sum(r.first["sampled_accuracy"] for r in group) / len(group),
            "sampled_end": sum(r.last["sampled_accuracy"] for r in group) / len(group),
            "greedy_start": sum(r.first["greedy_accuracy"] for r in group) / len(group),
            "greedy_end": sum(r.last["greedy_accuracy"] for r in group) / len(group),
            "gap_closed": _gap(group, teacher, everything), "gap_closed_95": _interval(gaps),
            "kl_start": kl_start, "kl_end": kl_end, "kl_change": kl_end - kl_start, "kl_change_95": _interval(falls),
        })
    return rows


def markdown(rows: list[dict[str, Any]], teacher: dict[str, Any]) -> str:
    """The rows as a Markdown table."""
    lines = [
        f"Teacher on the same held-out items: sampled {teacher['sampled_accuracy']:.3f}, greedy {teacher['greedy_accuracy']:.3f}.",
        "",
        "| arm | lr | seeds | steps (rollouts) | sampled acc. start -> end | greedy start -> end | gap closed [95%] | held-out reverse KL start -> end | change [95%] |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| `{r['arm']}` | {r['lr']:g} | {', '.join(map(str, r['seeds']))} | {' / '.join(map(str, r['steps']))} ({' / '.join(map(str, r['rollouts']))}) "
            f"| {r['sampled_start']:.3f} -> {r['sampled_end']:.3f} | {r['greedy_start']:.3f} -> {r['greedy_end']:.3f} "
            f"| {r['gap_closed']:+.3f} [{r['gap_closed_95'][0]:+.3f}, {r['gap_closed_95'][1]:+.3f}] "
            f"| {r['kl_start']:.3f} -> {r['kl_end']:.3f} | {r['kl_change']:+.3f} [{r['kl_change_95'][0]:+.3f}, {r['kl_change_95'][1]:+.3f}] |")
    lines += ["", "Gap closed at each evaluation every seed of the arm made (pooled over its seeds), and the optimiser steps to "
              + " and ".join(f"{level:.0%}" for level in LEVELS) + " (linear between evaluations; - : not in its budget):", ""]
    for r in rows:
        reached = ", ".join(f"{level:.0%}: {'-' if r[f'steps_to_{level:g}'] is None else round(r[f'steps_to_{level:g}'])}" for level in LEVELS)
        lines.append(f"- `{r['arm']}` {r['lr']:g}: " + ", ".join(f"{step}: {gap:+.3f}" for step, gap in r["gap_curve"]) + f" ({reached})")
    return "\n".join(lines) + "\n"


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="the directory experiments.opd_plain.sweep wrote")
    parser.add_argument("--out", type=Path, help="the Markdown table to write (default: report.md in the results)")
    args = parser.parse_args()
    runs, teacher = load_runs(args.results)
    rows = summarise(runs, teacher)
    out = args.out or args.results / "report.md"
    out.write_text(markdown(rows, teacher))
    (out.with_suffix(".json")).write_text(json.dumps(rows, indent=1))
    logger.info("%d runs in %d arms: %s", len(runs), len(rows), out)


if __name__ == "__main__":
    main()
