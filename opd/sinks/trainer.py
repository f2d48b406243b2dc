"""trainer=local: the reference trainer as a sink, closing the loop in one run.

Written groups gather into batches of `trainer.batch_groups`. Each full batch is one optimiser
step (`opd.train.trainer`, in a thread: the event loop and the rollouts in flight go on), the new
weights are saved and loaded into the serving vLLM in place (`opd.train.refresh`), the served
weights are checked against the trainer's (`opd.train.refresh_check`, `trainer/refresh_check`;
a mismatch fails the run), and the served weights' version goes up (`opd.serving.weights`, which the
environment reads), so every later group records the version it was generated with. A group more than `trainer.max_staleness` versions behind is not trained on
(counted in `summary/stale_groups_dropped`); it is in groups.jsonl all the same. Awaiting the step
is the back-pressure: no group is written while the trainer works. At the end the final weights
(the checkpoint last served and evaluated) are logged to MLflow (`final_weights/`), a checkpoint
`server.model=` can serve again.
"""

from __future__ import annotations

import asyncio
import logging
import math
import statistics
from pathlib import Path
from typing import Any

from opd.config import LocalTrainerConfig
from opd.serving.weights import ServedWeights
from opd.sinks.base import Sink, Written
from opd.tracking.mlflow_run import Tracker
from opd.train.refresh import refresh
from opd.train.refresh_check import RefreshCheck

logger = logging.getLogger(__name__)


class TrainerSink(Sink):
    def __init__(self, cfg: LocalTrainerConfig, env: Any, model_dir: str, base_urls: list[str], out_dir: Path, tracker: Tracker | None,
                 api_key: str = "opd-local") -> None:
        """`model_dir`: the checkpoint the trainer starts from, also the name the servers serve it under.
        The served weights' version is the environment's `served_weights` (`ServedWeights`): this sink
        raises it after each refresh, the environment reads it."""
        self.cfg, self.env, self.model_dir, self.base_urls, self.tracker, self.api_key = cfg, env, model_dir, base_urls, tracker, api_key
        self.served_weights: ServedWeights = env.served_weights
        self.weights_dir = out_dir / "weights"
        self.trainer: Any = None
        self.check: RefreshCheck | None = None
        self.pending: list[dict[str, Any]] = []
        self.steps = 0
        # Batches in which no group was left to train on (all equal-score groups, dropped).
        self.empty_batches = 0
        self.equal_dropped = 0
        self.checks: list[float] = []
        # Failed server requests seen at the last step (a WARNING says when more failed since).
        self.request_errors = 0
        self.stale_dropped = 0
        self.staleness: list[int] = []
        # Every step's trainer/* metrics, in order.
        self.history: list[dict[str, float]] = []

    async def open(self) -> None:
        from opd.train.trainer import LocalTrainer

        self.trainer = await asyncio.to_thread(LocalTrainer, self.cfg, self.model_dir)
        if self.cfg.refresh:
            # The servers may hold other weights: a sweep's shared server keeps the last job's, an
            # external one another run's. Every closed loop starts from the checkpoint it trains,
            # saved by the trainer with its own output layer (a tied checkpoint's reload would
            # leave the previous job's output layer in place; opd.train.untied).
            start = await asyncio.to_thread(self.trainer.save, self.weights_dir)
            seconds = await refresh(self.base_urls, start)
            logger.info("served weights reset to the checkpoint %s in %.2f s", self.model_dir, seconds)
            if self.cfg.refresh_check.enabled:
                self.check = RefreshCheck(self.cfg.refresh_check, self.base_urls, self.model_dir, self.trainer.tokenizer, self.api_key)
                floor = await self.check.start(self.trainer.probe_logprobs)
                self.checks.append(floor)
                if self.tracker is not None:
                    self.tracker.log_metrics({"trainer/refresh_check": floor, "trainer/refresh_check_limit": self.check.limit}, 0)

    async def write(self, written: Written) -> None:
        group = written.group
        lag = self.served_weights.version - int(group.get("group_overrides", {}).get("weight_version", 0))
        if lag > self.cfg.max_staleness:
            if not self.stale_dropped:
                logger.warning("a group %d weight versions old was not trained on (trainer.max_staleness=%d; counted in summary/stale_groups_dropped)",
                               lag, self.cfg.max_staleness)
            self.stale_dropped += 1
            return
        self.pending.append(group)
        self.staleness.append(lag)
        if len(self.pending) >= self.cfg.batch_groups:
            await self.update(written.step)

    async def update(self, step: int) -> None:
        """One step on the pending groups, then the served weights follow."""
        groups, self.pending = self.pending, []
        lags, self.staleness = self.staleness, []
        metrics = await asyncio.to_thread(self.trainer.step, groups)
        if metrics is None:
            self.empty_batches += 1
            self.equal_dropped += len(groups)
            logger.warning("no group of this batch had scores that differ (trainer.equal_score_groups=drop): no step, the weights stay "
                           "(counted in summary/trainer_empty_batches)")
            return
        self.equal_dropped += int(metrics["trainer/equal_score_groups_dropped"])
        await asyncio.to_thread(self.trainer.save, self.weights_dir)
        metrics["trainer/refresh_s"] = await refresh(self.base_urls, self.weights_dir) if self.cfg.refresh else 0.0
        self.served_weights.advance()
        if self.check is not None:
            metrics["trainer/refresh_check"] = await self.check.after_refresh(self.trainer.probe_logprobs, self.served_weights.version)
            self.checks.append(metrics["trainer/refresh_check"])
        self.steps += 1
        metrics.update({"trainer/weight_version": float(self.served_weights.version), "trainer/staleness_mean": statistics.fmean(lags),
                        "trainer/groups": float(len(groups)), "trainer/stale_groups_dropped": float(self.stale_dropped),
                        "trainer/server_request_errors": float(self.env.request_errors)})
        self.history.append(metrics)
        if self.env.request_errors > self.request_errors:
            logger.warning("%d requests to the inference servers failed for good, after their retries, since the last trainer step (%d in "
                           "all; trainer/server_request_errors); the last: %s", self.env.request_errors - self.request_errors, self.env.request_errors,
                           self.env.server.last_error)
            self.request_errors = self.env.request_errors
        logger.info("trainer step %d on %d groups: loss %.4f, KL to sampler %.4f, ratio max %.2f, %.1f s, refresh %.2f s, served vs trained %.4f nats",
                    self.steps, len(groups), metrics["trainer/loss"], metrics["trainer/kl_to_sampler"], metrics["trainer/ratio_max"],
                    metrics["trainer/step_s"], metrics["trainer/refresh_s"], metrics.get("trainer/refresh_check", math.nan))
        if self.tracker is not None:
            self.tracker.log_metrics(metrics, step)

    async def server_restarted(self) -> None:
        """A restarted server starts from the weights it was started with: load the trainer's."""
        if self.cfg.refresh and self.trainer is not None and self.weights_dir.exists():
            seconds = await refresh(self.base_urls, self.weights_dir)
            logger.warning("the restarted server serves weight version %d again (reloaded in %.2f s)", self.served_weights.version, seconds)
            if self.check is not None:
                await self.check.after_refresh(self.trainer.probe_logprobs, self.served_weights.version)

    async def close(self, status: str) -> None:
        if self.pending:
            logger.info("%d groups at the end of the run did not fill a trainer batch (trainer.batch_groups=%d); not trained on "
                        "(summary/untrained_groups)", len(self.pending), self.cfg.batch_groups)
        if self.tracker is not None and self.steps and self.weights_dir.exists():
            try:
                self.tracker.log_artifacts(self.weights_dir, "final_weights")
            except Exception as err:  # noqa: BLE001 - logged; the weights are on disk
                logger.warning("could not log the final weights: %s", err)

    def summary(self) -> dict[str, float]:
        out = {"summary/trainer_steps": float(self.steps), "summary/stale_groups_dropped": float(self.stale_dropped),
               "summary/untrained_groups": float(len(self.pending)), "summary/weight_version": float(self.served_weights.version),
               "summary/equal_score_groups_dropped": float(self.equal_dropped), "summary/trainer_empty_batches": float(self.empty_batches)}
        if self.checks:
            out["summary/refresh_check_floor"] = self.checks[0]
            out["summary/refresh_check_max"] = max(self.checks[1:], default=self.checks[0])
        return out
