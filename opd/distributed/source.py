"""The run's groups spread over Ray environment workers, behind the runner's `GroupSource`.

The driver keeps everything that makes a run one run: the item order (its own environment's
seeded shuffle, so a resumed run skips the same items), the record check, the sinks (the one
writer of groups.jsonl, the MLflow run, a local trainer, evaluation) and the summary. The runner
(`opd.runner`) drives this source exactly as it drives an environment: its groups in flight,
retries and `total_steps` are unchanged; each group it starts goes to the worker with the fewest
groups in flight for its share of the request slots.

A worker that dies (its process killed, out of memory, its node gone) loses only its groups in
flight: each is counted (`runner/worker_groups_lost`, `summary/worker_groups_lost`), logged, and
started again on another worker, without using up its item's attempts. Meanwhile the worker is
probed: Ray restarts it (`runner.ray.max_restarts`) and it takes groups again, or it is gone for
good (`summary/workers_lost`). With no worker left the run ends with `WorkersLost`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any, Iterator

from opd import latency
from opd.config import Config
from opd.data.sources import TaskSet
from opd.envs.base import RolloutEnv

logger = logging.getLogger(__name__)


class WorkersLost(RuntimeError):
    """Every environment worker died and none can be restarted."""


@dataclass
class Worker:
    """The driver's view of one worker actor."""

    index: int
    actor: Any
    # Its request slots per server (the weight of its share of the groups).
    slots: int
    in_flight: int = 0
    # Groups it returned.
    groups: int = 0
    up: bool = True
    gone: bool = False
    # Its constructor's arguments in the object store: held so that Ray can restart it.
    args: Any = None


class WorkerSource:
    """A `GroupSource` over `workers`; items, metrics and weight versions from `env` (the driver's)."""

    def __init__(self, env: RolloutEnv, workers: list[Worker], restart_timeout_s: float = 600.0) -> None:
        self.env = env
        self.workers = workers
        # How long a restarting worker may stay unavailable before it counts as gone (a restart
        # sets its environment up again: runner.ray.startup_timeout_s).
        self.restart_timeout_s = restart_timeout_s
        self.groups_lost = 0
        self.restarts = 0
        self._changed: asyncio.Event | None = None  # set when a worker comes back or is gone

    # ---- the GroupSource the runner drives --------------------------------------------------

    async def get_next_item(self) -> Any:
        return await self.env.get_next_item()

    def group_metrics(self, group: dict[str, Any]) -> dict[str, float]:
        return {**self.env.group_metrics(group), "runner/worker_groups_lost": float(self.groups_lost)}

    async def collect_trajectories(self, item: Any) -> tuple[dict[str, Any], list]:
        """One group of `item` from a worker; a worker's death sends it to another."""
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        avoid = None
        ledger = latency.current()  # the run asks where the time goes: the worker times its part too
        while True:
            worker = await self._pick(avoid)
            worker.in_flight += 1
            ref = worker.actor.collect.remote(item, self.env.served_weights.version, *(() if ledger is None else (True,)))
            try:
                group = await ref
                if ledger is not None:
                    group, spent = group
                    latency.absorb(ledger, spent, time.perf_counter())
                worker.groups += 1
                return group, []
            except RayTaskError as err:
                # The environment raised: the runner counts and retries it as it would locally.
                cause = err.cause if isinstance(err.cause, BaseException) else None
                raise (cause or err) from None
            except RayActorError as err:
                self.groups_lost += 1
                item_id = item.get("id", "?") if isinstance(item, dict) else item
                logger.warning("environment worker %d died with the group of item %s in flight (%d groups lost so far); starting it on another worker: %s",
                               worker.index, item_id, self.groups_lost, str(err).splitlines()[0][:200])
                self._down(worker)
                avoid = worker
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):  # a worker that is gone has nothing to stop
                    ray.cancel(ref)  # the worker stops the group too
                raise
            finally:
                worker.in_flight -= 1

    # ---- choosing and probing workers -------------------------------------------------------

    async def _pick(self, avoid: Worker | None) -> Worker:
        """The live worker with the fewest groups in flight for its slots (another than `avoid`
        when there is one); waits while every worker is restarting."""
        while True:
            live = [w for w in self.workers if w.up]
            if live:
                others = [w for w in live if w is not avoid] or live
                return min(others, key=lambda w: (w.in_flight / w.slots, w.index))
            if all(w.gone for w in self.workers):
                raise WorkersLost(f"all {len(self.workers)} environment workers died (runner.ray.max_restarts restarts each); see the log")
            # One event for every waiter; a probe's end replaces it before setting it (_wake).
            self._changed = self._changed or asyncio.Event()
            await self._changed.wait()

    def _down(self, worker: Worker) -> None:
        if worker.up:
            worker.up = False
            asyncio.get_running_loop().create_task(self._probe(worker))

    async def _probe(self, worker: Worker) -> None:
        """Wait for Ray to restart `worker` (it takes groups again) or to give it up. While Ray
        restarts it, a call fails with ActorUnavailableError: asked again after a pause, until
        `restart_timeout_s`; any other actor error means it is gone."""
        from ray.exceptions import ActorUnavailableError, RayActorError

        deadline = asyncio.get_running_loop().time() + self.restart_timeout_s
        pause = 0.2
        while True:
            try:
                await worker.actor.ping.remote()
                worker.up = True
                self.restarts += 1
                logger.warning("environment worker %d was restarted and takes groups again", worker.index)
                break
            except ActorUnavailableError as err:
                if asyncio.get_running_loop().time() + pause < deadline:
                    await asyncio.sleep(pause)
                    pause = min(2 * pause, 5.0)
                    continue
                self._gone(worker, f"still unavailable after {self.restart_timeout_s:.0f} s: {err}")
                break
            except RayActorError as err:
                self._gone(worker, str(err))
                break
        self._wake()

    def _wake(self) -> None:
        """Wake every group waiting for a worker; each looks again, and those still waiting share
        a new event (clearing it after a wake-up instead could drop another waiter's event)."""
        event, self._changed = self._changed, None
        if event is not None:
            event.set()

    def _gone(self, worker: Worker, why: str) -> None:
        worker.gone = True
        logger.warning("environment worker %d is gone for good (%d of %d left): %s", worker.index,
                       sum(not w.gone for w in self.workers), len(self.workers), why.splitlines()[0][:200])

    # ---- the summary ------------------------------------------------------------------------

    async def summary(self) -> dict[str, float]:
        """`summary/*` of the workers: groups lost with a worker, restarts, workers gone, the
        request errors and retries of the live workers' server pools, groups per worker."""
        from ray.exceptions import RayActorError

        errors = retries = cancelled = reconnects = 0.0
        for worker in self.workers:
            if worker.gone:
                continue
            try:
                stats = await worker.actor.stats.remote()
            except RayActorError:
                continue
            errors += stats["request_errors"]
            retries += stats["request_retries"]
            cancelled += stats["requests_cancelled"]
            reconnects += stats["reconnects"]
        return {"summary/workers": float(len(self.workers)), "summary/worker_groups_lost": float(self.groups_lost),
                "summary/worker_restarts": float(self.restarts), "summary/workers_lost": float(sum(w.gone for w in self.workers)),
                "summary/worker_request_errors": errors, "summary/worker_request_retries": retries,
                "summary/worker_requests_cancelled": cancelled, "summary/worker_reconnects": reconnects,
                **{f"summary/worker_{w.index}_groups": float(w.groups) for w in self.workers}}


def start_workers(ray: Any, cfg: Config, data: TaskSet, model: str, base_urls: list[str], teacher: tuple[Any, Any] | None = None) -> list[Worker]:
    """`runner.workers` actors on the connected cluster, each with its environment set up (and
    the teacher's scorer, built from `teacher`: opd.distributed.worker.teacher_scorer); waits for them
    (`runner.ray.startup_timeout_s`) and fails naming what they asked for."""
    from ray.exceptions import GetTimeoutError

    from opd.distributed.worker import EnvWorker, slot_share

    count, settings = cfg.runner.workers, cfg.runner.ray
    # Workers on other nodes do not inherit this process's environment.
    env_vars = {"RAY_USE_UVLOOP": "1" if cfg.runner.uvloop else "0", "WANDB_MODE": "disabled", "WANDB_SILENT": "true"}
    actor = ray.remote(EnvWorker).options(num_cpus=settings.cpus_per_worker, max_restarts=settings.max_restarts, max_task_retries=0,
                                          runtime_env={"env_vars": env_vars})
    data_ref = ray.put(data)  # once in the object store; a restarted worker reads it again
    actors = [actor.remote(cfg, data_ref, model, list(base_urls), index, count, teacher) for index in range(count)]
    try:
        pids = ray.get([a.ping.remote() for a in actors], timeout=settings.startup_timeout_s)
    except GetTimeoutError:
        raise RuntimeError(f"{count} environment workers of {settings.cpus_per_worker} CPUs each did not start within "
                           f"runner.ray.startup_timeout_s={settings.startup_timeout_s} s (cluster resources: {ray.cluster_resources()})") from None
    logger.info("%d environment workers ready (pids %s)", count, ", ".join(map(str, pids)))
    slots = cfg.server.max_requests_in_flight
    return [Worker(index, a, slot_share(slots, count, index), args=data_ref) for index, a in enumerate(actors)]


def stop_workers(ray: Any, workers: list[Worker], timeout_s: float = 30.0) -> None:
    """Close the workers' environments (their HTTP sessions); the cluster ends them after."""
    refs = [w.actor.close.remote() for w in workers if not w.gone]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    for ref in ready:
        try:
            ray.get(ref)
        except Exception as err:  # noqa: BLE001 - logged; the process ends with the cluster anyway
            logger.warning("an environment worker did not close cleanly: %s", str(err).splitlines()[0][:200])


@contextlib.contextmanager
def environment_workers(cfg: Config, data: TaskSet, model: str, base_urls: list[str],
                        teacher: tuple[Any, Any] | None = None) -> Iterator[list[Worker]]:
    """The Ray cluster (joined or local) and `runner.workers` environment workers on it (scoring
    with the teacher kind's scorer when `teacher` gives its kind and what its run ships,
    `opd.teachers.workers_teacher`), stopped at the end, also on errors."""
    from opd.distributed.cluster import ray_cluster

    if cfg.tracking.traces:
        logger.warning("tracking.traces: rollouts in Ray workers are not traced (runner.workers=%d)", cfg.runner.workers)
    with ray_cluster(cfg.runner.ray, cfg.runner.workers) as ray:
        workers = start_workers(ray, cfg, data, model, base_urls, teacher)
        try:
            yield workers
        finally:
            stop_workers(ray, workers)
