"""One environment worker: a Ray actor that builds the run's environment in its own process and
generates the groups the driver asks for.

Each worker has its own event loop (Ray's for async actors: uvloop unless `runner.uvloop=false`),
its own sandboxes, and its share of every server's request slots (`slot_share`): the workers
together never hold more than `server.max_requests_in_flight` requests per server, nor more than
`teacher.max_concurrent` scoring requests to the teacher's servers (which the driver started and
watches; a worker only sends them requests, with the scorer its teacher kind builds:
`teacher_scorer`). It gets the
dataset and the config from the driver, so nothing is read again on another node. It writes
nothing: groups go back to the driver, which checks and writes them.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import time
from dataclasses import replace
from typing import Any

from opd import latency
from opd.config import Config
from opd.data.sources import TaskSet

logger = logging.getLogger(__name__)


def slot_share(slots: int, workers: int, index: int) -> int:
    """Worker `index`'s share of `slots` request slots: equal, the first ones get the remainder."""
    if not 0 <= index < workers or slots < workers:
        raise ValueError(f"slot_share needs 0 <= index < workers <= slots (got index {index}, {workers} workers, {slots} slots)")
    return slots // workers + (1 if index < slots % workers else 0)


def teacher_scorer(cfg: Config, teacher: tuple[Any, Any] | None, policy_urls: list[str], index: int, workers: int) -> Any:
    """Worker `index`'s scorer, or None where no teacher scores (`teacher` None). `teacher`: the
    run's teacher kind (its registry entry, a class of opd.teachers) and what the driver's run
    shipped to workers (`TeacherRun.for_workers`). The kind, over `cfg` (the worker's own copy,
    whose `teacher.max_concurrent`, where its kind's config has one, becomes this worker's share),
    rebuilds the run (`worker_run`) and gives its scorer by the driver's call (`Teacher.scorer`)."""
    if teacher is None:
        return None
    from opd.tracking.traces import Tracer

    kind, shipped = teacher
    if hasattr(cfg.teacher, "max_concurrent"):
        cfg.teacher = replace(cfg.teacher, max_concurrent=slot_share(cfg.teacher.max_concurrent, workers, index))
    taught = kind(cfg)
    return taught.scorer(taught.worker_run(shipped), policy_urls, Tracer.off())


class EnvWorker:
    """The actor (created with `ray.remote(EnvWorker)`): see the module docstring."""

    def __init__(self, cfg: Config, data: TaskSet, model: str, base_urls: list[str], index: int, workers: int,
                 teacher: tuple[Any, Any] | None = None) -> None:
        """`teacher`: what the worker's scorer is built from (`teacher_scorer`), or None."""
        from opd import build
        from opd.tracking.traces import Tracer

        self.index = index
        self.slots = slot_share(cfg.server.max_requests_in_flight, workers, index)
        cfg = copy.copy(cfg)  # not replace(): the root's checks would see a share below runner.workers
        cfg.server = replace(cfg.server, max_requests_in_flight=self.slots)
        judge = build.judge_pool(cfg)
        scorer = teacher_scorer(cfg, teacher, base_urls, index, workers)
        self.env = build.environment(cfg, data, model, build.server_pool(cfg, model, base_urls), Tracer.off(), judge, scorer)
        self.ready = False
        logger.info("environment worker %d (pid %d): %s, %d request slots per server", index, os.getpid(), cfg.env.name, self.slots)

    async def ping(self) -> int:
        """The worker's process id, once its environment is set up."""
        if not self.ready:
            await self.env.setup()
            self.ready = True
        return os.getpid()

    async def collect(self, item: dict[str, Any], weight_version: int, timed: bool = False) -> dict[str, Any] | tuple[dict[str, Any], dict[str, Any]]:
        """One group of `item`, recording `weight_version` (the driver's, which a trainer raises);
        with `timed`, also where its time went here (`opd.latency.export`)."""
        self.env.served_weights.follow(weight_version)
        if not timed:
            group, _ = await self.env.collect_trajectories(item)
            return dict(group)
        ledger = latency.Ledger()
        group, _ = await asyncio.ensure_future(latency.within(ledger, self.env.collect_trajectories(item)))  # a task: the ledger stays in it
        return dict(group), latency.export(ledger)

    def stats(self) -> dict[str, float]:
        """What the summary adds up over workers, and this process's CPU seconds so far (the
        overhead bench's cost per rollout in the workers)."""
        requests = self.env.request_counts()
        return {"request_errors": float(requests.failed), "request_retries": float(requests.retries),
                "requests_cancelled": float(requests.cancelled), "reconnects": float(requests.reconnects), "cpu_s": time.process_time()}

    async def close(self) -> None:
        await self.env.close()
