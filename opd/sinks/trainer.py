"""trainer=local: the reference trainer as a sink, closing the loop in one run.

Written groups gather into batches of `trainer.batch_groups`. Each full batch is one optimiser
step (`opd.train.trainer`, in a thread: the event loop and the rollouts in flight go on), the new
weights are saved and loaded into the serving vLLM in place (`opd.train.refresh`), and the
environment's `weight_version` goes up, so every later group records the version it was
generated with. A group more than `trainer.max_staleness` versions behind is not trained on
(counted in `summary/stale_groups_dropped`); it is in groups.jsonl all the same. Awaiting the step
is the back-pressure: no group is written while the trainer works. At the end the final weights
are logged to MLflow (`final_weights/`), a checkpoint `server.model=` can serve again.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
from pathlib import Path
from typing import Any

from opd.config import LocalTrainerConfig
from opd.sinks.base import Sink, Written
from opd.tracking.run import Tracker
from opd.train.refresh import refresh

logger = logging.getLogger(__name__)


class TrainerSink(Sink):
    def __init__(self, cfg: LocalTrainerConfig, env: Any, model_dir: str, base_urls: list[str], out_dir: Path, tracker: Tracker | None) -> None:
        self.cfg, self.env, self.model_dir, self.base_urls, self.tracker = cfg, env, model_dir, base_urls, tracker
        self.weights_dir = out_dir / "weights"
        self.trainer: Any = None
        self.pending: list[dict[str, Any]] = []
        self.steps = 0
        self.stale_dropped = 0
        self.staleness: list[int] = []
        # Every step's trainer/* metrics, in order.
        self.history: list[dict[str, float]] = []

    async def open(self) -> None:
        from opd.train.trainer import LocalTrainer

        self.trainer = await asyncio.to_thread(LocalTrainer, self.cfg, self.model_dir)
        if self.cfg.refresh:
            # The servers may hold other weights: a sweep's shared server keeps the last job's, an
            # external one another run's. Every closed loop starts from the checkpoint it trains.
            # A hub name is not a directory vLLM can reload from: the trainer's copy is saved first.
            start = Path(self.model_dir)
            if not start.is_dir():
                start = await asyncio.to_thread(self.trainer.save, self.weights_dir)
            seconds = await refresh(self.base_urls, start)
            logger.info("served weights reset to the checkpoint %s in %.2f s", self.model_dir, seconds)

    async def write(self, written: Written) -> None:
        group = written.group
        lag = self.env.weight_version - int(group.get("group_overrides", {}).get("weight_version", 0))
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
        await asyncio.to_thread(self.trainer.save, self.weights_dir)
        metrics["trainer/refresh_s"] = await refresh(self.base_urls, self.weights_dir) if self.cfg.refresh else 0.0
        self.env.weight_version += 1
        self.steps += 1
        metrics.update({"trainer/weight_version": float(self.env.weight_version), "trainer/staleness_mean": statistics.fmean(lags),
                        "trainer/groups": float(len(groups)), "trainer/stale_groups_dropped": float(self.stale_dropped)})
        self.history.append(metrics)
        logger.info("trainer step %d on %d groups: loss %.4f, KL to sampler %.4f, %.1f s, refresh %.2f s",
                    self.steps, len(groups), metrics["trainer/loss"], metrics["trainer/kl_to_sampler"], metrics["trainer/step_s"], metrics["trainer/refresh_s"])
        if self.tracker is not None:
            self.tracker.log_metrics(metrics, step)

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
        return {"summary/trainer_steps": float(self.steps), "summary/stale_groups_dropped": float(self.stale_dropped),
                "summary/untrained_groups": float(len(self.pending)), "summary/weight_version": float(self.env.weight_version)}
