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
  correct samples, rewards), also an MLflow artifact;
- the greedy rollouts as an MLflow table (`eval/samples_step_<N>.json`: prompt, response,
  reward, correct, turns), which the UI shows in its Evaluation tab.
At the end the summary compares the last evaluation with the first, item by item
(`paired_change`): the mean paired gain, its bootstrap confidence interval over items and a
one-sided Wilcoxon signed-rank p-value.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from opd.config import EvalConfig
from opd.envs.base import EvalReport, RolloutEnv
from opd.run_files import make_dir, replace_file
from opd.sinks.base import Sink, Written
from opd.tracking.mlflow_run import Tracker

logger = logging.getLogger(__name__)


class Evaluator(Sink):
    def __init__(self, env: RolloutEnv, cfg: EvalConfig, concurrency: int, out_dir: Path, tracker: Tracker | None) -> None:
        self.env, self.cfg, self.concurrency, self.out_dir, self.tracker = env, cfg, concurrency, out_dir, tracker
        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.first_items: list[dict[str, Any]] = []
        self.last_items: list[dict[str, Any]] = []
        self.last_step = -1
        self.step = 0

    async def run(self, step: int) -> EvalReport:
        """Evaluate now and record it at `step`."""
        errors = self.env.request_errors
        report = await self.env.evaluate(concurrency=self.concurrency, samples_per_item=self.cfg.samples_per_item,
                                         sample_temperature=self.cfg.temperature, max_items=self.cfg.max_items, seed=self.cfg.seed)
        report.metrics["eval/server_request_errors"] = float(self.env.request_errors - errors)
        self.last, self.last_step, self.last_items = report.metrics, step, report.items
        if not self.first:
            self.first, self.first_items = report.metrics, report.items
        path = make_dir(self.out_dir / "eval") / f"step_{step:06d}.jsonl"  # opd.run_files: no link or FIFO followed
        replace_file(path, "".join(json.dumps(row) + "\n" for row in report.items))
        logger.info("evaluation at step %d: accuracy %.3f, sampled accuracy %.3f over %d items", step,
                    report.metrics.get("eval/accuracy", 0.0), report.metrics.get("eval/sampled_accuracy", float("nan")), len(report.items))
        if self.tracker is not None:
            self.tracker.log_metrics(report.metrics, step)
            self.tracker.log_artifact(path, "eval")
            self.tracker.log_table(_columns(report.samples), f"eval/samples_step_{step:06d}.json")
        return report

    async def open(self) -> None:
        if self.cfg.every is not None:
            await self.run(0)

    async def write(self, written: Written) -> None:
        self.step = written.step
        if self.cfg.every is not None and written.step % self.cfg.every == 0:
            await self.run(written.step)

    async def close(self, status: str) -> None:
        if self.cfg.every is not None and status == "FINISHED" and self.last_step != self.step:
            await self.run(self.step)

    def summary(self) -> dict[str, float]:
        out = {}
        for name in ("eval/accuracy", "eval/sampled_accuracy", "eval/reward_mean", "eval/sampled_format_violation_rate"):
            if name in self.last:
                key = name.split("/", 1)[1]
                out[f"summary/first_{key}"] = self.first[name]
                out[f"summary/final_{key}"] = self.last[name]
        if self.last_items is not self.first_items:
            out.update(paired_change(self.first_items, self.last_items, self.cfg.confidence))
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


def paired_change(first: list[dict[str, Any]], last: list[dict[str, Any]], confidence: float = 0.95, resamples: int = 10_000) -> dict[str, float]:
    """Did held-out accuracy rise from the first evaluation to the last, beyond the noise? Paired
    over the same items (per-item accuracy, `item_accuracy`), as `paired_statistics` of the
    per-item changes, under the `summary/eval_paired_*` names."""
    stats = paired_statistics(list(item_changes(first, last).values()), confidence, resamples)
    return {f"summary/eval_paired_{name}": value for name, value in stats.items()}


def item_changes(first: list[dict[str, Any]], last: list[dict[str, Any]]) -> dict[str, float]:
    """{item id: its accuracy in `last` minus in `first`} over the items both evaluated."""
    before = {row["item_id"]: item_accuracy(row) for row in first}
    return {row["item_id"]: after - before[row["item_id"]] for row in last
            if before.get(row["item_id"]) is not None and (after := item_accuracy(row)) is not None}


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
