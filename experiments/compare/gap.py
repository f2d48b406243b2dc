"""The gap to the teacher closed by each point of a sweep, and how fast, for `experiments.compare`.

A closed-loop run with teacher=model evaluates its teacher once on the held-out items with the
same seeded samples (`eval.teacher`: the artifact `eval/teacher.jsonl`) and logs, at every
evaluation, `eval/gap_closed`, `eval/weight_version` (optimiser steps so far) and `eval/wall_s`.
Per point (an arm; each item averaged over the point's seeds):
- gap closed = paired held-out gain / (teacher - student at the start), on the same items, with
  the gain's bootstrap interval scaled by the same gap (the teacher's evaluation is one fixed
  measurement of the same seeded draws, so the gap is held fixed);
- its curve against optimiser steps, rollouts and wall time (mean over seeds, their range), and
  the optimiser steps at which the mean curve first reaches each level of `LEVELS` (linear between
  evaluations), so arms are compared on the steps they need, as on-policy distillation is judged;
- the quantity on-policy distillation minimises, the per-token reverse KL to the teacher on the
  student's fresh samples (`teacher/reverse_kl`, one value per group), averaged over windows of
  `KL_WINDOW` groups: its curve per point and its first and last window; and the same quantity
  on the held-out samples (`eval/sampled_reverse_kl_to_teacher`, the same seeded items at every
  evaluation, so its change is the student's, not the items'), at the first and last evaluation,
  and its change paired item by item with a bootstrap interval over items.
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger("experiments.compare")

# Levels of gap closed at which the optimiser steps each point needed are reported.
LEVELS = (0.1, 0.25, 0.5)
# The x axes of the curves: the metric each evaluation logs, and its label.
AXES = (("eval/weight_version", "optimiser steps"), ("rollouts", "rollouts generated"), ("eval/wall_s", "wall time (s)"))


@dataclass
class Curve:
    """One run's evaluations: x values by axis name, and gap closed, in evaluation order."""

    x: dict[str, list[float]]
    gap_closed: list[float]


def teacher_items(client: Any, run_id: str, tmp: Path) -> dict[str, float] | None:
    """{item id: the teacher's accuracy} from the run's `eval/teacher.jsonl`; None without one."""
    from opd.sinks.evaluation import item_accuracy

    if not any(a.path == "eval/teacher.jsonl" for a in client.list_artifacts(run_id, "eval")):
        return None
    local = Path(client.download_artifacts(run_id, "eval/teacher.jsonl", str(tmp / run_id)))
    rows = [json.loads(line) for line in local.read_text().splitlines() if line.strip()]
    return {r["item_id"]: a for r in rows if (a := item_accuracy(r)) is not None}


def gap_columns(change: dict[str, float], first: dict[str, float], teacher: dict[str, float], stats: dict[str, float]) -> dict[str, float]:
    """`teacher_accuracy`, `gap` and `gap_closed` with its interval (`_low`, `_high`) of one point:
    `change` and `first` are its per-item change and first accuracy (seed means), `teacher` the
    teacher's per-item accuracy, `stats` the paired statistics of `change`. Empty when the
    teacher is not ahead on these items (no gap to close)."""
    items = [item for item in change if item in teacher and item in first]
    if not items:
        return {}
    ceiling = sum(teacher[item] for item in items) / len(items)
    gap = ceiling - sum(first[item] for item in items) / len(items)
    if gap <= 0:
        return {"teacher_accuracy": ceiling, "gap": gap}
    return {"teacher_accuracy": ceiling, "gap": gap, "gap_closed": stats["gain"] / gap,
            "gap_closed_low": stats["gain_low"] / gap, "gap_closed_high": stats["gain_high"] / gap}


def run_curve(client: Any, run_id: str) -> Curve | None:
    """The run's gap-closed curve (None when it logged fewer than two points of it)."""
    history = {name: {m.step: m.value for m in client.get_metric_history(run_id, name)}
               for name in ("eval/gap_closed", "eval/weight_version", "eval/wall_s")}
    steps = sorted(set.intersection(*(set(h) for h in history.values())))
    if len(steps) < 2:
        return None
    group_size = float(client.get_run(run_id).data.params.get("group_size", "nan"))
    x = {"eval/weight_version": [history["eval/weight_version"][s] for s in steps], "rollouts": [s * group_size for s in steps],
         "eval/wall_s": [history["eval/wall_s"][s] for s in steps]}
    return Curve(x, [history["eval/gap_closed"][s] for s in steps])


def mean_curve(curves: list[Curve]) -> Curve:
    """The mean over runs at each evaluation they all made (index by index), with x means too."""
    n = min(len(c.gap_closed) for c in curves)
    x = {axis: [sum(c.x[axis][i] for c in curves) / len(curves) for i in range(n)] for axis in curves[0].x}
    return Curve(x, [sum(c.gap_closed[i] for c in curves) / len(curves) for i in range(n)])


def steps_to(curve: Curve, level: float, axis: str = "eval/weight_version") -> float | None:
    """Where on `axis` the curve first reaches `level` (linear between evaluations); None if never."""
    xs, ys = curve.x[axis], curve.gap_closed
    for i, y in enumerate(ys):
        if y >= level:
            if i == 0 or ys[i - 1] >= level:
                return xs[i]
            x0, x1, y0 = xs[i - 1], xs[i], ys[i - 1]
            return x0 + (x1 - x0) * (level - y0) / (y - y0)
    return None


def speed_rows(curves: dict[str, list[Curve]], levels: tuple[float, ...] = LEVELS) -> list[dict[str, Any]]:
    """Per point: its final mean gap closed and the optimiser steps its mean curve needed to reach
    each level ('' where it never did)."""
    rows = []
    for label, runs in curves.items():
        mean = mean_curve(runs)
        row: dict[str, Any] = {"point": label, "seeds": len(runs), "final_gap_closed": mean.gap_closed[-1]}
        for level in levels:
            reached = steps_to(mean, level)
            row[f"steps_to_{level:g}"] = "" if reached is None else round(reached, 1)
        rows.append(row)
    return rows


def speedups(rows: list[dict[str, Any]], baseline: str) -> list[str]:
    """How many times fewer optimiser steps each point needed than `baseline` to reach a level
    both reached; a level only one reached is said as such."""
    base = next((r for r in rows if r["point"] == baseline), None)
    if base is None:
        return []
    lines = []
    for row in rows:
        if row is base:
            continue
        for key in (k for k in row if k.startswith("steps_to_")):
            level = key.removeprefix("steps_to_")
            mine, theirs = row[key], base[key]
            if mine != "" and theirs != "":
                lines.append(f"{row['point']} reaches gap closed {level} in {mine:g} optimiser steps, {baseline} in {theirs:g}: "
                             f"{theirs / mine:.2g}x {'fewer' if mine <= theirs else 'more'} steps" if mine > 0 else
                             f"{row['point']} starts at gap closed {level}, {baseline} reaches it in {theirs:g} steps")
            elif mine != "":
                lines.append(f"{row['point']} reaches gap closed {level} in {mine:g} optimiser steps; {baseline} never does in its budget")
            elif theirs != "":
                lines.append(f"{baseline} reaches gap closed {level} in {theirs:g} optimiser steps; {row['point']} never does in its budget")
    return lines


def write_gap_curves(curves: dict[str, list[Curve]], gaps: dict[str, dict[str, float]], path: Path) -> Path | None:
    """Gap closed against optimiser steps, rollouts and wall time: one line per point (the mean
    over its seeds, their range as a band), labelled with its final gap closed and interval."""
    if not curves:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(AXES), figsize=(5.2 * len(AXES), 4.0), squeeze=False)
    for ax, (axis, label) in zip(axes[0], AXES):
        for point, runs in curves.items():
            mean = mean_curve(runs)
            n = len(mean.gap_closed)
            low = [min(c.gap_closed[i] for c in runs) for i in range(n)]
            high = [max(c.gap_closed[i] for c in runs) for i in range(n)]
            g = gaps.get(point, {})
            text = point + (f"  {g['gap_closed']:+.2f} [{g['gap_closed_low']:+.2f}, {g['gap_closed_high']:+.2f}]" if "gap_closed" in g else "")
            (line,) = ax.plot(mean.x[axis], mean.gap_closed, marker="o", label=text)
            if len(runs) > 1:
                ax.fill_between(mean.x[axis], low, high, color=line.get_color(), alpha=0.2)
        ax.axhline(0.0, color="grey", lw=0.8)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xlabel(label)
        ax.set_ylabel("gap to the teacher closed")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="best", title="final [paired interval]", title_fontsize=7)
    fig.suptitle("held-out gap to the teacher closed: (student now - student at start) / (teacher - student at start)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# The per-group metric of the reverse KL to the teacher on the student's fresh samples, and the
# groups its curve is averaged over (one group is one problem: kinds differ a lot).
REVERSE_KL = "teacher/reverse_kl"
KL_WINDOW = 10


def kl_curve(client: Any, run_id: str, window: int = KL_WINDOW) -> tuple[list[float], list[float]] | None:
    """(groups written, the mean of `REVERSE_KL` over the `window` groups up to there) of one
    run, one point per full window; None without the metric."""
    history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, REVERSE_KL))
    if len(history) < window:
        return None
    xs, ys = [], []
    for end in range(window, len(history) + 1, window):
        chunk = history[end - window : end]
        xs.append(float(chunk[-1][0]))
        ys.append(sum(v for _, v in chunk) / window)
    return xs, ys


def kl_rows(curves: dict[str, list[tuple[list[float], list[float]]]]) -> list[dict[str, Any]]:
    """Per point: the reverse KL on fresh samples over its first and last window (mean over seeds)."""
    rows = []
    for label, runs in curves.items():
        rows.append({"point": label, "seeds": len(runs), "reverse_kl_first": sum(ys[0] for _, ys in runs) / len(runs),
                     "reverse_kl_last": sum(ys[-1] for _, ys in runs) / len(runs)})
    return rows


# The per-evaluation metric of the reverse KL to the teacher on the held-out samples.
HELD_OUT_KL = "eval/sampled_reverse_kl_to_teacher"


def held_out_kl(client: Any, run_id: str) -> tuple[float, float] | None:
    """`HELD_OUT_KL` at a run's first and last evaluation; None without two evaluations of it."""
    history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, HELD_OUT_KL))
    return (history[0][1], history[-1][1]) if len(history) >= 2 else None


def held_out_kl_rows(points: dict[str, list[tuple[float, float]]]) -> list[dict[str, Any]]:
    """Per point: the held-out reverse KL at the first and last evaluation (mean over seeds)."""
    return [{"point": label, "reverse_kl_held_out_first": sum(a for a, _ in runs) / len(runs),
             "reverse_kl_held_out_last": sum(b for _, b in runs) / len(runs)} for label, runs in points.items()]


def held_out_kl_change(changes: list[dict[str, float]], confidence: float = 0.95) -> dict[str, float]:
    """The per-item change of the held-out reverse KL from the first evaluation to the last, each
    item averaged over the seeds that evaluated it first and last in all of them, as the mean and its
    bootstrap interval over items (`reverse_kl_held_out_change`, `_low`, `_high`); {} without items."""
    from opd.sinks.evaluation import paired_statistics

    items = [item for item in changes[0] if all(item in c for c in changes[1:])] if changes else []
    if not items:
        return {}
    stats = paired_statistics([sum(c[item] for c in changes) / len(changes) for item in items], confidence)
    return {"reverse_kl_held_out_change": stats["gain"], "reverse_kl_held_out_change_low": stats["gain_low"],
            "reverse_kl_held_out_change_high": stats["gain_high"]}


def write_kl_curves(curves: dict[str, list[tuple[list[float], list[float]]]], path: Path) -> Path | None:
    """The reverse KL to the teacher on the student's fresh samples against groups written: one
    line per point (mean over its seeds of each window's mean), their range as a band."""
    if not curves:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for label, runs in curves.items():
        n = min(len(ys) for _, ys in runs)
        xs = runs[0][0][:n]
        mean = [sum(ys[i] for _, ys in runs) / len(runs) for i in range(n)]
        (line,) = ax.plot(xs, mean, marker="o", label=label)
        if len(runs) > 1:
            ax.fill_between(xs, [min(ys[i] for _, ys in runs) for i in range(n)], [max(ys[i] for _, ys in runs) for i in range(n)],
                            color=line.get_color(), alpha=0.2)
    ax.set_xlabel("groups written")
    ax.set_ylabel(f"per-token reverse KL to the teacher (nats), mean of {KL_WINDOW} groups")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    ax.set_title("KL(student || teacher) on the student's own fresh samples", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def baseline_label(labels: list[str]) -> str | None:
    """The point the others are measured against: the one whose arm is grpo (the reward alone)."""
    return next((label for label in labels if re.search(r"(^|,)arm=grpo(,|$)", label)), None)


def finite(value: Any) -> bool:
    return isinstance(value, float) and math.isfinite(value)
