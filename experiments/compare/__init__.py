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
(`experiments.compare.gap`), with how many times fewer steps than the grpo arm.
"""

from __future__ import annotations

from experiments.compare.load import DEFAULT_URI, Point, Sweep, eval_rows, gain_points, load, locate
from experiments.compare.report import (compare, main, mean_curves, table, write_csv, write_eval_curves, write_gain_curves,
                                        write_plot)
from experiments.compare.statistics import gain_ranking, gain_separation, points, separation, verdicts_disagree

__all__ = ["DEFAULT_URI", "Point", "Sweep", "compare", "eval_rows", "gain_points", "gain_ranking", "gain_separation", "load", "locate", "main",
           "mean_curves", "points", "separation", "table", "verdicts_disagree", "write_csv", "write_eval_curves",
           "write_gain_curves", "write_plot"]
