"""Evaluation of the held-out split with the current weights: at the start (step 0), every
`eval.every` written groups, and at the end of a run; or once, for mode=evaluate.

Each evaluation runs one greedy rollout per item (`env.eval_temperature`) and
`eval.samples_per_item` sampled ones (`eval.temperature`), every request seeded from `eval.seed`,
the item and the sample (`RolloutEnv.evaluate`): evaluations of the same weights draw the same
random stream, so the first and the last evaluation of a run, or two jobs' evaluations, are
compared on the same draws. It records:
- `eval/*` metrics at the step (groups written so far): accuracy (greedy), sampled accuracy,
  reward, the env's own per-item means, and the same per kind of item where the dataset has
  kinds (`eval/accuracy/<kind>`, `eval/sampled_accuracy/<kind>`,
  `eval/sampled_format_violation_rate/<kind>`, ...); the requests that failed meanwhile;
- one line per item in `<run dir>/eval/step_<N>.jsonl` (item, kind, greedy result, samples,
  correct samples, rewards, the means of the samples' own values such as
  `sampled_reverse_kl_to_teacher`), also an MLflow artifact;
- the greedy rollouts as an MLflow table (`eval/samples_step_<N>.json`: prompt, response,
  reward, correct, turns), which the UI shows in its Evaluation tab.
At the end the summary compares the last evaluation with the first, item by item
(`paired_change`): the mean paired gain, its bootstrap confidence interval over items and a
one-sided Wilcoxon signed-rank p-value; with a teacher model, the same for the held-out reverse KL
to the teacher (`summary/reverse_kl_change`, `_low`, `_high`: negative is the student nearer).

Each evaluation also records how far training has gone when it ran: `eval/weight_version` (the
optimiser steps the served weights have had) and `eval/wall_s` (seconds since the first
evaluation began). With a teacher model (`Ceiling`: the same environment generating with the
teacher, `eval.teacher`), the teacher is evaluated once before the first evaluation, on the same
items with the same seeded samples (`teacher_eval/*`, `<run dir>/eval/teacher.jsonl`; a sweep's
jobs share one such evaluation, kept in the sweep's directory): the ceiling. Every evaluation after it then logs `eval/gap_closed`, the share of the student's gap to
the teacher closed since the first evaluation, (now - first) / (teacher - first), on sampled
accuracy where there are samples (greedy otherwise); the summary gives the final one with the
paired gain's interval scaled by the same gap (`summary/gap_closed`, `_low`, `_high`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from opd.config import EvalConfig
from opd.envs.base import EvalReport, RolloutEnv
from opd.run_files import make_dir, read_text, replace_file
from opd.sinks.base import Sink, Written
from opd.tracking.mlflow_run import Tracker

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ceiling:
    """The teacher's side of the evaluation: the environment generating with the teacher's server
    (closed with the evaluator), and where its evaluation may be kept for other runs of the same
    teacher, items and seeds (a sweep's directory: its jobs evaluate the same teacher; None: not kept)."""

    env: RolloutEnv
    teacher: str
    cache_dir: Path | None = None


class Evaluator(Sink):
    def __init__(self, env: RolloutEnv, cfg: EvalConfig, concurrency: int, out_dir: Path, tracker: Tracker | None,
                 ceiling: Ceiling | None = None) -> None:
        """`ceiling`: the teacher, evaluated once as the ceiling of `eval/gap_closed`."""
        self.env, self.cfg, self.concurrency, self.out_dir, self.tracker = env, cfg, concurrency, out_dir, tracker
        self.ceiling = ceiling
        # The teacher's evaluation metrics (eval/* names), once it ran.
        self.teacher: dict[str, float] = {}
        self.started: float | None = None
        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.first_items: list[dict[str, Any]] = []
        self.last_items: list[dict[str, Any]] = []
        self.last_step = -1
        self.step = 0

    @property
    def measure(self) -> str:
        """The accuracy that gap closed is taken on: sampled where there are samples, else greedy."""
        return "eval/sampled_accuracy" if self.cfg.samples_per_item else "eval/accuracy"

    async def _evaluate(self, env: RolloutEnv) -> EvalReport:
        errors = env.request_errors
        report = await env.evaluate(concurrency=self.concurrency, samples_per_item=self.cfg.samples_per_item,
                                    sample_temperature=self.cfg.temperature, max_items=self.cfg.max_items, seed=self.cfg.seed)
        report.metrics["eval/server_request_errors"] = float(env.request_errors - errors)
        return report

    def _write(self, report: EvalReport, name: str) -> Path:
        path = make_dir(self.out_dir / "eval") / f"{name}.jsonl"  # opd.run_files: no link or FIFO followed
        return replace_file(path, "".join(json.dumps(row) + "\n" for row in report.items))

    async def run(self, step: int) -> EvalReport:
        """Evaluate now and record it at `step`."""
        if self.started is None:
            self.started = time.monotonic()
        report = await self._evaluate(self.env)
        report.metrics["eval/weight_version"] = float(self.env.served_weights.version)
        report.metrics["eval/wall_s"] = time.monotonic() - self.started
        self.last, self.last_step, self.last_items = report.metrics, step, report.items
        if not self.first:
            self.first, self.first_items = report.metrics, report.items
        if (closed := self.gap_closed(report.metrics)) is not None:
            report.metrics["eval/gap_closed"] = closed
        path = self._write(report, f"step_{step:06d}")
        logger.info("evaluation at step %d: accuracy %.3f, sampled accuracy %.3f over %d items%s", step,
                    report.metrics.get("eval/accuracy", 0.0), report.metrics.get("eval/sampled_accuracy", float("nan")), len(report.items),
                    f", gap to the teacher closed {closed:+.3f}" if closed is not None else "")
        if self.tracker is not None:
            self.tracker.log_metrics(report.metrics, step)
            self.tracker.log_artifact(path, "eval")
            self.tracker.log_table(_columns(report.samples), f"eval/samples_step_{step:06d}.json")
        return report

    def _ceiling_file(self) -> Path | None:
        """Where the teacher's evaluation is kept for runs of the same teacher, env, items and
        evaluation settings (None: not kept)."""
        assert self.ceiling is not None
        if self.ceiling.cache_dir is None:
            return None
        items = self.env.data.eval[: self.cfg.max_items] if self.cfg.max_items else self.env.data.eval
        key = json.dumps({"teacher": self.ceiling.teacher, "env": self.env.name, "greedy_temperature": self.env.eval_temperature,
                          "samples": self.cfg.samples_per_item, "temperature": self.cfg.temperature, "seed": self.cfg.seed,
                          "items": [item.get("id") for item in items]}, sort_keys=True)
        return self.ceiling.cache_dir / f"teacher_eval_{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"

    async def run_teacher(self) -> None:
        """Evaluate the teacher (the ceiling), once, recorded as `teacher_eval/*` at step 0; read
        from the ceiling's cache when another run of the same sweep evaluated it."""
        assert self.ceiling is not None
        self.started = time.monotonic()
        kept = self._ceiling_file()
        if kept is not None and os.path.lexists(kept):  # read_text refuses a link or anything but a regular file
            saved = json.loads(read_text(kept))
            report = EvalReport(saved["metrics"], saved["items"], [])
            logger.info("the teacher's evaluation is the one %s holds (the same teacher, items and seeds)", kept)
        else:
            report = await self._evaluate(self.ceiling.env)
            if kept is not None:
                make_dir(kept.parent)
                replace_file(kept, json.dumps({"metrics": report.metrics, "items": report.items}))
        self.teacher = report.metrics
        path = self._write(report, "teacher")
        logger.info("the teacher's evaluation (the ceiling): accuracy %.3f, sampled accuracy %.3f over %d items",
                    report.metrics.get("eval/accuracy", 0.0), report.metrics.get("eval/sampled_accuracy", float("nan")), len(report.items))
        if self.tracker is not None:
            self.tracker.log_metrics({"teacher_eval/" + name.removeprefix("eval/"): value for name, value in report.metrics.items()}, 0)
            self.tracker.log_artifact(path, "eval")

    def gap(self) -> float | None:
        """teacher - student at the first evaluation, on `measure`; None without a teacher's
        evaluation or where the teacher is not ahead (there is no gap to close)."""
        if not self.teacher or not self.first:
            return None
        gap = self.teacher[self.measure] - self.first[self.measure]
        return gap if gap > 0 else None

    def gap_closed(self, metrics: dict[str, float]) -> float | None:
        """(now - first) / (teacher - first) on `measure`; None where there is no gap."""
        gap = self.gap()
        return None if gap is None else (metrics[self.measure] - self.first[self.measure]) / gap

    async def open(self) -> None:
        if self.cfg.every is not None:
            if self.ceiling is not None:
                await self.run_teacher()
            await self.run(0)
            if self.teacher and self.gap() is None:
                logger.warning("the teacher (%s %.3f) is not ahead of the student (%.3f) at the start: eval/gap_closed is undefined in this run",
                               self.measure, self.teacher[self.measure], self.first[self.measure])

    async def write(self, written: Written) -> None:
        self.step = written.step
        if self.cfg.every is not None and written.step % self.cfg.every == 0:
            await self.run(written.step)

    async def close(self, status: str) -> None:
        try:
            if self.cfg.every is not None and status == "FINISHED" and self.last_step != self.step:
                await self.run(self.step)
        finally:
            if self.ceiling is not None:
                await self.ceiling.env.close()

    def summary(self) -> dict[str, float]:
        out = {}
        for name in ("eval/accuracy", "eval/sampled_accuracy", "eval/reward_mean", "eval/sampled_format_violation_rate", "eval/" + HELD_OUT_KL):
            if name in self.last:
                key = name.split("/", 1)[1]
                out[f"summary/first_{key}"] = self.first[name]
                out[f"summary/final_{key}"] = self.last[name]
        if self.last_items is not self.first_items:
            out.update(paired_change(self.first_items, self.last_items, self.cfg.confidence))
            out.update(paired_kl_change(self.first_items, self.last_items, self.cfg.confidence))
        if self.teacher:
            out["summary/teacher_" + self.measure.split("/", 1)[1]] = self.teacher[self.measure]
            # NaN where it is undefined (the teacher not ahead at the start, a single evaluation).
            gap = self.gap() if "summary/eval_paired_gain" in out else None
            for name in ("", "_low", "_high"):
                out[f"summary/gap_closed{name}"] = out[f"summary/eval_paired_gain{name}"] / gap if gap is not None else math.nan
            logger.info("held-out paired gain from the first evaluation to the last: %+.4f per item, %.0f%% interval [%+.4f, %+.4f] "
                        "(bootstrap over %d items), one-sided Wilcoxon p = %.4g", out["summary/eval_paired_gain"], 100 * self.cfg.confidence,
                        out["summary/eval_paired_gain_low"], out["summary/eval_paired_gain_high"], out["summary/eval_paired_items"],
                        out["summary/eval_paired_p"])
        return out


def item_accuracy(row: dict[str, Any]) -> float | None:
    """An item's sampled accuracy (correct samples / samples), or its greedy result without samples."""
    if row.get("samples"):
        return row["sampled_correct"] / row["samples"]
    return None if row.get("greedy_correct") is None else float(row["greedy_correct"])


# The per-item column (and, under eval/, the metric) of the reverse KL to the teacher on the
# held-out samples (`RolloutEnv.eval_item`, runs with a teacher model).
HELD_OUT_KL = "sampled_reverse_kl_to_teacher"


def item_kl(row: dict[str, Any]) -> float | None:
    """An item's reverse KL to the teacher, the mean over its sampled rollouts (None without)."""
    return row.get(HELD_OUT_KL)


def paired_kl_change(first: list[dict[str, Any]], last: list[dict[str, Any]], confidence: float = 0.95) -> dict[str, float]:
    """Did the held-out reverse KL to the teacher fall from the first evaluation to the last?
    The mean per-item change and its bootstrap interval over items, under
    `summary/reverse_kl_change*` (`_low`, `_high`, `_items`); nothing where the rows have no KL."""
    changes = item_changes(first, last, item_kl)
    if not changes:
        return {}
    stats = paired_statistics(list(changes.values()), confidence)
    out = {"summary/reverse_kl_change": stats["gain"], "summary/reverse_kl_change_low": stats["gain_low"],
           "summary/reverse_kl_change_high": stats["gain_high"], "summary/reverse_kl_change_items": stats["items"]}
    logger.info("held-out reverse KL to the teacher from the first evaluation to the last: %+.4f per item, %.0f%% interval [%+.4f, %+.4f] "
                "(bootstrap over %d items)", stats["gain"], 100 * confidence, stats["gain_low"], stats["gain_high"], stats["items"])
    return out


def paired_change(first: list[dict[str, Any]], last: list[dict[str, Any]], confidence: float = 0.95, resamples: int = 10_000) -> dict[str, float]:
    """Did held-out accuracy rise from the first evaluation to the last, beyond the noise? Paired
    over the same items (per-item accuracy, `item_accuracy`), as `paired_statistics` of the
    per-item changes, under the `summary/eval_paired_*` names."""
    stats = paired_statistics(list(item_changes(first, last).values()), confidence, resamples)
    return {f"summary/eval_paired_{name}": value for name, value in stats.items()}


def item_changes(first: list[dict[str, Any]], last: list[dict[str, Any]],
                 value: Callable[[dict[str, Any]], float | None] = item_accuracy) -> dict[str, float]:
    """{item id: its `value` (accuracy) in `last` minus in `first`} over the items both evaluated."""
    before = {row["item_id"]: value(row) for row in first}
    return {row["item_id"]: after - before[row["item_id"]] for row in last
            if before.get(row["item_id"]) is not None and (after := value(row)) is not None}


def paired_statistics(diffs: list[float], confidence: float = 0.95, resamples: int = 10_000) -> dict[str, float]:
    """Paired per-item differences, summarised:
    - `gain`: their mean;
    - `gain_low` / `gain_high`: its `confidence` interval, a percentile bootstrap over items
      (`resamples` resamples, a fixed seed: the same differences give the same interval);
    - `p`: Wilcoxon's signed-rank test, one-sided (a rise), zero differences left out;
    - `items`, `items_changed`: how many differences, how many not zero."""
    import numpy as np
    from scipy.stats import wilcoxon

    values = np.array(diffs, dtype=np.float64)
    changed = values[values != 0]
    p = float(wilcoxon(changed, alternative="greater").pvalue) if len(changed) >= 2 else 1.0
    gain = float(values.mean()) if len(values) else 0.0
    low = high = gain
    if len(values) >= 2:
        means = np.random.default_rng(0).choice(values, size=(resamples, len(values)), replace=True).mean(axis=1)
        low, high = (float(x) for x in np.quantile(means, [(1 - confidence) / 2, (1 + confidence) / 2]))
    return {"items": float(len(values)), "items_changed": float(len(changed)), "gain": gain, "gain_low": low, "gain_high": high, "p": p}


def _columns(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    keys = list(rows[0]) if rows else []
    return {key: [row.get(key) for row in rows] for key in keys}
