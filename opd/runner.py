"""The generation loop: several groups in flight, each isolated, written as soon as it is done.

- Up to `groups_in_flight` groups are collected concurrently. The server's own limit is on
  requests (atroposlib's per-server semaphore, `server.max_requests_in_flight`); by default the
  runner keeps more rollouts in flight than that (`groups_to_fill`), so that while some rollouts
  run tools, are scored or wait for the rest of their group, others hold every request slot.
- A group that raises is counted, logged once with its cause and its item retried up to
  `max_attempts_per_item` times; then the item is given up. The run goes on.
- Only written groups count towards `total_steps`; more than `max_failed_groups` failures end
  the run with an error instead of looping forever.
- Each group is checked (`opd.records.check_group`) and appended to groups.jsonl, flushed.
- After a failure `on_failure` may check the inference server (opd.serving.watch) before more
  groups start.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Protocol

from tqdm import tqdm

from opd.records import GroupWriter, check_group

logger = logging.getLogger(__name__)


class GroupSource(Protocol):
    async def get_next_item(self) -> Any: ...
    async def collect_trajectories(self, item: Any) -> tuple[Any, list]: ...
    def group_metrics(self, group: dict[str, Any]) -> dict[str, float]: ...


class TooManyFailures(RuntimeError):
    """More groups failed than `runner.max_failed_groups` allows."""


@dataclass
class RunStats:
    written: int = 0
    failed: int = 0
    items_given_up: int = 0
    started: float = field(default_factory=time.monotonic)
    failure_causes: dict[str, int] = field(default_factory=dict)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started


def groups_to_fill(request_slots: int, group_size: int, oversubscribe: float) -> int:
    """Groups in flight so that `request_slots` x `oversubscribe` rollouts are (at least) in flight."""
    if request_slots < 1 or group_size < 1 or oversubscribe < 1:
        raise ValueError(f"groups_to_fill needs slots >= 1, group_size >= 1, oversubscribe >= 1 (got {request_slots}, {group_size}, {oversubscribe})")
    return max(1, math.ceil(request_slots * oversubscribe / group_size))


MetricsSink = Callable[[dict[str, float], int], None]
# Called with each group after it is written (mode=serve sends it on); awaiting it is back-pressure.
GroupSink = Callable[[dict[str, Any]], Awaitable[None]]


async def run_generation(
    env: GroupSource,
    writer: GroupWriter,
    total_steps: int,
    *,
    groups_in_flight: int,
    max_attempts_per_item: int,
    max_failed_groups: int,
    on_metrics: MetricsSink | None = None,
    on_group: GroupSink | None = None,
    on_failure: Callable[[BaseException], Awaitable[None]] | None = None,
    progress: bool = True,
    already_written: int = 0,
    skip_items: Counter[str] | None = None,
) -> RunStats:
    """Write groups from `env` to `writer` until `total_steps` are written; return what happened.

    A resumed run passes the groups it kept (`already_written`) and their item ids (`skip_items`,
    each skipped as often as it was done) so no item is done twice.
    """
    stats = RunStats(written=already_written)
    skip = Counter(skip_items or {})
    retry: deque[tuple[Any, int]] = deque()
    bar = tqdm(total=total_steps, initial=already_written, desc="groups", unit="group", disable=not progress, dynamic_ncols=True)

    async def next_item() -> Any:
        while True:
            item = await env.get_next_item()
            item_id = item.get("id") if isinstance(item, dict) else None
            if item_id is not None and skip[item_id] > 0:
                skip[item_id] -= 1
                continue
            return item

    async def attempt(item: Any, tries: int) -> tuple[Any, int, dict[str, Any]]:
        group, _ = await env.collect_trajectories(item)
        return item, tries, group

    in_flight: dict[asyncio.Task, tuple[Any, int]] = {}
    try:
        while stats.written < total_steps:
            # Enough in flight to finish, never more than the limit.
            while len(in_flight) < groups_in_flight and stats.written + len(in_flight) < total_steps:
                item, tries = retry.popleft() if retry else (await next_item(), 0)
                task = asyncio.create_task(attempt(item, tries + 1))
                in_flight[task] = (item, tries + 1)
            done, _ = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                item, tries = in_flight.pop(task)
                err = task.exception()
                if err is None:
                    group = task.result()[2]
                    problems = check_group(group)
                    if problems:
                        err = ValueError("; ".join(problems[:3]))
                if err is not None:
                    _record_failure(stats, item, tries, err, max_attempts_per_item, retry)
                    bar.set_postfix(failed=stats.failed)
                    if on_failure is not None:
                        # Is the server still there? (restarts it, or waits, or raises; nothing new starts meanwhile)
                        await on_failure(err)
                    if stats.failed > max_failed_groups:
                        raise TooManyFailures(
                            f"{stats.failed} groups failed (runner.max_failed_groups={max_failed_groups}); "
                            f"causes: {stats.failure_causes}"
                        ) from err
                    continue
                if stats.written >= total_steps:
                    continue
                writer.write(group)
                stats.written += 1
                if on_group is not None:
                    await on_group(group)
                bar.update(1)
                bar.set_postfix(failed=stats.failed, groups_per_s=f"{(stats.written - already_written) / stats.elapsed:.2f}")
                if on_metrics is not None:
                    metrics = dict(env.group_metrics(group))
                    metrics.update(
                        {
                            "runner/groups_written": float(stats.written),
                            "runner/groups_failed": float(stats.failed),
                            "runner/groups_per_s": (stats.written - already_written) / stats.elapsed,
                        }
                    )
                    on_metrics(metrics, stats.written)
    finally:
        for task in in_flight:
            task.cancel()
        if in_flight:
            await asyncio.gather(*in_flight, return_exceptions=True)
        bar.close()
    return stats


def _record_failure(stats: RunStats, item: Any, tries: int, err: BaseException, max_attempts: int, retry: deque) -> None:
    stats.failed += 1
    cause = type(err).__name__
    stats.failure_causes[cause] = stats.failure_causes.get(cause, 0) + 1
    item_id = item.get("id", "?") if isinstance(item, dict) else "?"
    if tries < max_attempts:
        logger.warning("group for item %s failed (attempt %d/%d), retrying: %s: %s", item_id, tries, max_attempts, cause, str(err)[:300])
        retry.append((item, tries))
    else:
        stats.items_given_up += 1
        logger.warning("group for item %s failed (attempt %d/%d), giving it up: %s: %s", item_id, tries, max_attempts, cause, str(err)[:300])
