"""The generation loop: several groups in flight, each isolated, handed to the sinks when done.

- Up to `groups_in_flight` groups are collected concurrently. The servers' limit is on requests
  (`opd.serving.pool`); by default the runner keeps more rollouts in flight than that
  (`groups_to_fill`), so that while some rollouts run tools, are scored or wait for the rest of
  their group, others hold every request slot.
- A group that raises, or that breaks a record rule (`opd.records.is_valid`, the one check), is
  counted, logged once with its cause and its item retried up to `max_attempts_per_item` times;
  then the item is given up. The run goes on. A group that raises a `ConfigError` (a setup check
  that finished after the first requests went out, e.g. the model's parser names) ends the run
  at once with it.
- Only written groups count towards `total_steps`; more than `max_failed_groups` failures end
  the run with an error instead of looping forever.
- A valid group that `drop` names a reason for (e.g. every rollout scored the same, which
  atroposlib drops before a trainer sees it) is counted, not written and not retried; more than
  `max_dropped_groups` drops end the run with an error too.
- Each accepted group goes to every sink in order (the JSONL file first) with its metrics.
- After a failure `on_failure` may check the inference server (opd.serving.watch) before more
  groups start.
- A resumed run passes the groups it kept: they count as written, their items are skipped as
  often as they were done, and their metrics start the history.
- Besides the console's bar, `Progress` says where the run is in its log (and wherever
  `publish` sends it, e.g. an MLflow tag): a line every `every` written groups, and while none is
  written for `quiet_after_s`, a line every `quiet_after_s` saying so, so a slow run is never
  silent for long.
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

from opd import latency
from opd.config import ConfigError
from opd.records import check_group, is_valid
from opd.sinks.base import Sink, Written

logger = logging.getLogger(__name__)


class GroupSource(Protocol):
    async def get_next_item(self) -> Any: ...
    async def collect_trajectories(self, item: Any) -> tuple[Any, list]: ...
    def group_metrics(self, group: dict[str, Any]) -> dict[str, float]: ...


class TooManyFailures(RuntimeError):
    """More groups failed than `runner.max_failed_groups` allows."""


class TooManyDropped(RuntimeError):
    """More groups were dropped than `runner.max_dropped_groups` allows."""


@dataclass
class RunStats:
    written: int = 0
    failed: int = 0
    items_given_up: int = 0
    dropped: int = 0  # valid groups not written (`drop` gave a reason)
    drop_reasons: dict[str, int] = field(default_factory=dict)
    resumed: int = 0  # groups kept from a killed run
    started: float = field(default_factory=time.monotonic)
    failure_causes: dict[str, int] = field(default_factory=dict)
    # Every per-group metric, in order of writing (kept groups first).
    history: dict[str, list[float]] = field(default_factory=dict)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @property
    def groups_per_s(self) -> float:
        return (self.written - self.resumed) / max(self.elapsed, 1e-9)

    def record(self, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.history.setdefault(key, []).append(float(value))


def groups_to_fill(request_slots: int, group_size: int, oversubscribe: float) -> int:
    """Groups in flight so that `request_slots` x `oversubscribe` rollouts are (at least) in flight."""
    if request_slots < 1 or group_size < 1 or oversubscribe < 1:
        raise ValueError(f"groups_to_fill needs slots >= 1, group_size >= 1, oversubscribe >= 1 (got {request_slots}, {group_size}, {oversubscribe})")
    return max(1, math.ceil(request_slots * oversubscribe / group_size))


def duration(seconds: float) -> str:
    """`45 s`, `12 min`, `2.5 h`."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


@dataclass(frozen=True)
class Progress:
    """What the runner says as it goes besides the console's bar (see the module docstring)."""

    # A line every this many written groups.
    every: int = 1
    # While no group is written for this long, a line every this many seconds (None: none).
    quiet_after_s: float | None = 60.0
    # Also called with every line (e.g. to set the MLflow run's `opd.progress` tag).
    publish: Callable[[str], None] | None = None
    # What the requests are doing now, for the quiet lines ("3 in flight, 1 retried, ...").
    requests: Callable[[], str] | None = None
    # The lines on the console too (when it shows no bar); else in the log file only.
    console: bool = False


@dataclass(frozen=True)
class RunnerLimits:
    groups_in_flight: int
    max_attempts_per_item: int
    max_failed_groups: int
    max_dropped_groups: int | None = None  # None: no limit


class Runner:
    """One generation run over `env`, writing to `sinks` (see the module docstring)."""

    def __init__(self, env: GroupSource, sinks: list[Sink], total_steps: int, limits: RunnerLimits, *,
                 on_failure: Callable[[BaseException], Awaitable[None]] | None = None, progress: bool = True,
                 kept: list[dict[str, Any]] | None = None, drop: Callable[[dict[str, Any]], str | None] | None = None,
                 latency_ledgers: list[tuple[latency.Ledger, float]] | None = None, report: Progress | None = None) -> None:
        self.env, self.sinks, self.total_steps, self.limits = env, sinks, total_steps, limits
        self.report = report
        # Progress lines that `report.publish` failed to send.
        self.unpublished = 0
        # When each group in flight started, and when the last group was written (monotonic).
        self._started_at: dict[asyncio.Task, float] = {}
        self._last_written = time.monotonic()
        # Given a list: each written group's latency ledger and when it was written (opd.latency).
        self.latency_ledgers = latency_ledgers
        self._ledgers: dict[asyncio.Task, latency.Ledger] = {}
        self.on_failure = on_failure
        self.drop = drop
        self.stats = RunStats()
        kept = kept or []
        self.stats.written = self.stats.resumed = len(kept)
        for group in kept:
            self.stats.record(env.group_metrics(group))
        self.skip = Counter(str(g.get("group_overrides", {}).get("item_id")) for g in kept)
        self.retry: deque[tuple[Any, int]] = deque()
        self.in_flight: dict[asyncio.Task, tuple[Any, int]] = {}
        self.bar = tqdm(total=total_steps, initial=len(kept), desc="groups", unit="group", disable=not progress, dynamic_ncols=True)

    async def run(self) -> RunStats:
        """Write groups until `total_steps` are written; return what happened."""
        watch = asyncio.create_task(self._while_quiet()) if self.report is not None and self.report.quiet_after_s else None
        try:
            while self.stats.written < self.total_steps:
                await self._fill()
                done, _ = await asyncio.wait(self.in_flight, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    await self._finished(task)
                    if len(done) > 1:
                        # Its replacement starts (renders its prompt, asks for slots) before the
                        # next finished group is checked and written: rounds of requests end
                        # together, and slots freed by several groups stayed idle behind all of
                        # their checks and writes (32 in flight x 100 ms: ~10% of the slot time).
                        await self._fill()
                        await asyncio.sleep(0)
        finally:
            if watch is not None:
                watch.cancel()
                await asyncio.gather(watch, return_exceptions=True)
            for task in self.in_flight:
                task.cancel()
            if self.in_flight:
                await asyncio.gather(*self.in_flight, return_exceptions=True)
            self.bar.close()
        return self.stats

    async def _fill(self) -> None:
        """Start groups: enough in flight to finish, never more than the limit."""
        while len(self.in_flight) < self.limits.groups_in_flight and self.stats.written + len(self.in_flight) < self.total_steps:
            item, tries = self.retry.popleft() if self.retry else (await self._next_item(), 0)
            if self.latency_ledgers is None:
                task = asyncio.create_task(self.env.collect_trajectories(item))
            else:
                ledger = latency.Ledger()
                task = asyncio.create_task(latency.within(ledger, self.env.collect_trajectories(item)))
                self._ledgers[task] = ledger
            self.in_flight[task] = (item, tries + 1)
            self._started_at[task] = time.monotonic()

    async def _next_item(self) -> Any:
        while True:
            item = await self.env.get_next_item()
            item_id = str(item.get("id")) if isinstance(item, dict) else None
            if item_id is not None and self.skip[item_id] > 0:
                self.skip[item_id] -= 1
                continue
            return item

    async def _finished(self, task: asyncio.Task) -> None:
        item, tries = self.in_flight.pop(task)
        self._started_at.pop(task, None)
        ledger = self._ledgers.pop(task, None)
        taken = time.perf_counter()
        err = task.exception()
        if isinstance(err, ConfigError):
            raise err
        group = None if err is not None else task.result()[0]
        if group is not None and not is_valid(group):
            err = ValueError("invalid group: " + "; ".join(check_group(group)[:3]))
        if ledger is not None and ledger.ended is not None:
            ledger.add("queued", taken - ledger.ended)
            ledger.add("check", time.perf_counter() - taken)
        if err is not None:
            await self._failed(item, tries, err)
        elif self.drop is not None and (reason := self.drop(group)) is not None:
            self._dropped(item, reason)
        elif self.stats.written < self.total_steps:
            await self._write(group, ledger)

    async def _write(self, group: dict[str, Any], ledger: latency.Ledger | None = None) -> None:
        started = time.perf_counter()
        self.stats.written += 1
        metrics = {
            **self.env.group_metrics(group),
            "runner/groups_written": float(self.stats.written),
            "runner/groups_failed": float(self.stats.failed),
            "runner/groups_dropped": float(self.stats.dropped),
            "runner/groups_per_s": self.stats.groups_per_s,
        }
        self.stats.record(metrics)
        written = Written(group, self.stats.written, metrics)
        for sink in self.sinks:
            await sink.write(written)
        if ledger is not None and self.latency_ledgers is not None:
            finished = time.perf_counter()
            ledger.add("sinks", finished - started)
            self.latency_ledgers.append((ledger, finished))
        self.bar.update(1)
        self.bar.set_postfix(failed=self.stats.failed, groups_per_s=f"{self.stats.groups_per_s:.2f}")
        self._last_written = time.monotonic()
        if self.report is not None and (self.stats.written % self.report.every == 0 or self.stats.written == self.total_steps):
            self._say(self.progress_line())

    def progress_line(self) -> str:
        """`groups: 3 of 10 written (0 failed, 0 dropped, 2 in flight), 1.2 per min, ETA 6 min`."""
        stats = self.stats
        line = (f"groups: {stats.written} of {self.total_steps} written ({stats.failed} failed, {stats.dropped} dropped, "
                f"{len(self.in_flight)} in flight)")
        made = stats.written - stats.resumed
        if made > 0:
            per_s = stats.groups_per_s
            line += f", {per_s * 60:.3g} per min" if per_s < 1 else f", {per_s:.3g} per s"
            if stats.written < self.total_steps:
                line += f", ETA {duration((self.total_steps - stats.written) / per_s)}"
        return line

    def quiet_line(self, now: float | None = None) -> str:
        """The progress line, with how long no group was written, how long the oldest group in
        flight has run and what the requests are doing."""
        now = time.monotonic() if now is None else now
        line = f"{self.progress_line()}; none written for {duration(now - self._last_written)}"
        if self._started_at:
            line += f", the oldest group in flight started {duration(now - min(self._started_at.values()))} ago"
        if self.report is not None and self.report.requests is not None:
            line += f"; requests: {self.report.requests()}"
        return line

    async def _while_quiet(self) -> None:
        """A quiet line every `quiet_after_s` while no group is written."""
        assert self.report is not None and self.report.quiet_after_s is not None
        every = self.report.quiet_after_s
        while True:
            await asyncio.sleep(max(0.0, self._last_written + every - time.monotonic()))
            if time.monotonic() - self._last_written >= every:
                self._say(self.quiet_line())
                await asyncio.sleep(every)

    def _say(self, line: str) -> None:
        assert self.report is not None
        logger.info("%s", line, extra={} if self.report.console else {"file_only": True})
        if self.report.publish is not None:
            try:
                self.report.publish(line)
            except Exception as err:  # noqa: BLE001 - a progress note never fails the run; its own call would
                self.unpublished += 1
                # The first failure is said at warning level, every one counted in `unpublished`.
                (logger.warning if self.unpublished == 1 else logger.debug)(
                    "progress line not published (%d so far; the run goes on): %s", self.unpublished, err)

    def _dropped(self, item: Any, reason: str) -> None:
        stats = self.stats
        stats.dropped += 1
        if reason not in stats.drop_reasons:
            logger.info("group for item %s dropped (%s); later drops for this reason are only counted (runner/groups_dropped)",
                        item.get("id", "?") if isinstance(item, dict) else item, reason)
        stats.drop_reasons[reason] = stats.drop_reasons.get(reason, 0) + 1
        self.bar.set_postfix(failed=stats.failed, dropped=stats.dropped)
        limit = self.limits.max_dropped_groups
        if limit is not None and stats.dropped > limit:
            raise TooManyDropped(f"{stats.dropped} groups dropped, {stats.written} written (runner.max_dropped_groups={limit}); "
                                 f"reasons: {stats.drop_reasons}")

    async def _failed(self, item: Any, tries: int, err: BaseException) -> None:
        stats = self.stats
        stats.failed += 1
        cause = type(err).__name__
        stats.failure_causes[cause] = stats.failure_causes.get(cause, 0) + 1
        item_id = item.get("id", "?") if isinstance(item, dict) else item
        if tries < self.limits.max_attempts_per_item:
            logger.warning("group for item %s failed (attempt %d/%d), retrying: %s: %s", item_id, tries, self.limits.max_attempts_per_item, cause, str(err)[:300])
            self.retry.append((item, tries))
        else:
            stats.items_given_up += 1
            logger.warning("group for item %s failed (attempt %d/%d), giving it up: %s: %s", item_id, tries, self.limits.max_attempts_per_item, cause, str(err)[:300])
        self.bar.set_postfix(failed=stats.failed)
        if self.on_failure is not None:
            # Is the server still there? (restarts it, or waits, or raises; nothing new starts meanwhile)
            await self.on_failure(err)
        if stats.failed > self.limits.max_failed_groups:
            raise TooManyFailures(f"{stats.failed} groups failed (runner.max_failed_groups={self.limits.max_failed_groups}); causes: {stats.failure_causes}") from err
