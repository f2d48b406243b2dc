"""The generation loop with a scripted env: isolation, retries, bounded failures, concurrency."""

from __future__ import annotations

import asyncio

import pytest

from helpers import make_group, sequence
from opd.records import read_groups
from opd.runner import Runner, RunnerLimits, TooManyDropped, TooManyFailures
from opd.sinks.base import Sink, Written
from opd.sinks.jsonl import GroupFile


def group_for(item: int) -> dict:
    return make_group([sequence([1, 2], [item + 3], -0.5)], [float(item)])


class ScriptedEnv:
    """Items 0, 1, 2, ...; `fail(item, attempt)` says which attempts raise."""

    def __init__(self, fail=lambda item, attempt: False, delay: float = 0.01) -> None:
        self.next = 0
        self.attempts: dict[int, int] = {}
        self.fail = fail
        self.delay = delay
        self.running = 0
        self.max_running = 0

    async def get_next_item(self) -> int:
        self.next += 1
        return self.next - 1

    async def collect_trajectories(self, item: int):
        self.attempts[item] = self.attempts.get(item, 0) + 1
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            await asyncio.sleep(self.delay)
            if self.fail(item, self.attempts[item]):
                raise ConnectionError(f"scripted failure of item {item}")
            return group_for(item), []
        finally:
            self.running -= 1

    def group_metrics(self, group: dict) -> dict[str, float]:
        return {"reward/mean": group["scores"][0]}


class Recorder(Sink):
    def __init__(self) -> None:
        self.seen: list[Written] = []

    async def write(self, written: Written) -> None:
        self.seen.append(written)


def run(env: ScriptedEnv, tmp_path, total: int, extra: list[Sink] = (), kept: list[dict] | None = None, drop=None, **kwargs):
    path = tmp_path / "groups.jsonl"
    limits = RunnerLimits(**{"groups_in_flight": 4, "max_attempts_per_item": 2, "max_failed_groups": 10, **kwargs})

    async def main():
        file = GroupFile(path)
        await file.open()
        try:
            return await Runner(env, [file, *extra], total, limits, progress=False, kept=kept, drop=drop).run()
        finally:
            await file.close("FINISHED")

    stats = asyncio.run(main())
    return stats, [g["scores"][0] for g in read_groups(path)]


def test_writes_exactly_total_steps_groups(tmp_path) -> None:
    env = ScriptedEnv()
    stats, scores = run(env, tmp_path, 10)
    assert stats.written == 10 and len(scores) == 10 and len(set(scores)) == 10
    assert 1 < env.max_running <= 4


def test_a_failing_group_is_retried_and_counted(tmp_path) -> None:
    env = ScriptedEnv(fail=lambda item, attempt: item == 2 and attempt == 1)
    stats, scores = run(env, tmp_path, 5)
    assert stats.written == 5 and stats.failed == 1 and stats.items_given_up == 0
    assert 2.0 in scores and env.attempts[2] == 2


def test_an_item_that_always_fails_is_given_up_and_the_run_goes_on(tmp_path) -> None:
    env = ScriptedEnv(fail=lambda item, attempt: item == 1)
    stats, scores = run(env, tmp_path, 5)
    assert stats.written == 5 and 1.0 not in scores
    assert stats.failed == 2 and stats.items_given_up == 1 and env.attempts[1] == 2
    assert stats.failure_causes == {"ConnectionError": 2}


def test_endless_failures_end_the_run_with_an_error(tmp_path) -> None:
    env = ScriptedEnv(fail=lambda item, attempt: True)
    with pytest.raises(TooManyFailures, match="max_failed_groups=3"):
        run(env, tmp_path, 5, max_failed_groups=3)
    assert sum(env.attempts.values()) <= 4 + 4  # bounded: no endless loop


def test_invalid_groups_are_not_written(tmp_path) -> None:
    class BadEnv(ScriptedEnv):
        async def collect_trajectories(self, item: int):
            group, _ = await super().collect_trajectories(item)
            if item == 0:
                group["masks"][0].pop()
            return group, []

    stats, scores = run(BadEnv(), tmp_path, 3)
    assert stats.written == 3 and stats.failed == 2 and 0.0 not in scores


def odd_scores(group: dict) -> str | None:
    return "odd" if group["scores"][0] % 2 else None


def test_dropped_groups_are_counted_not_written_nor_retried(tmp_path) -> None:
    env = ScriptedEnv()
    recorder = Recorder()
    stats, scores = run(env, tmp_path, 4, extra=[recorder], drop=odd_scores, max_dropped_groups=10)
    assert sorted(scores) == [0.0, 2.0, 4.0, 6.0]
    assert stats.written == 4 and stats.failed == 0 and stats.dropped >= 3 and stats.drop_reasons == {"odd": stats.dropped}
    assert all(n == 1 for n in env.attempts.values())  # a dropped item is not asked again
    assert recorder.seen[-1].metrics["runner/groups_dropped"] >= 3


def test_endless_drops_end_the_run_with_an_error(tmp_path) -> None:
    env = ScriptedEnv()
    with pytest.raises(TooManyDropped, match="max_dropped_groups=5"):
        run(env, tmp_path, 3, drop=lambda group: "always", max_dropped_groups=5)
    assert sum(env.attempts.values()) <= 6 + 4  # bounded: no endless loop


def test_every_sink_gets_each_written_group_with_its_step_and_metrics(tmp_path) -> None:
    recorder = Recorder()
    stats, scores = run(ScriptedEnv(), tmp_path, 3, extra=[recorder], groups_in_flight=2, max_attempts_per_item=1, max_failed_groups=0)
    assert [w.step for w in recorder.seen] == [1, 2, 3]
    assert [w.group["scores"][0] for w in recorder.seen] == scores  # the file first, the same groups in the same order
    assert all("runner/groups_per_s" in w.metrics and "reward/mean" in w.metrics for w in recorder.seen)
    assert stats.history["reward/mean"] == scores


def test_a_resumed_run_skips_the_kept_items_and_continues_the_count(tmp_path) -> None:
    kept = [group_for(0), group_for(1)]
    kept[0]["group_overrides"] = {"item_id": "0"}
    kept[1]["group_overrides"] = {"item_id": "1"}

    class NamedEnv(ScriptedEnv):
        async def get_next_item(self):
            return {"id": str(await super().get_next_item())}

        async def collect_trajectories(self, item):
            group, _ = await super().collect_trajectories(int(item["id"]))
            return group, []

    recorder = Recorder()
    stats, scores = run(NamedEnv(), tmp_path, 5, extra=[recorder], kept=kept)
    assert stats.written == 5 and stats.resumed == 2 and sorted(scores) == [2.0, 3.0, 4.0]  # items 0 and 1 not done again
    assert [w.step for w in recorder.seen] == [3, 4, 5]
    assert stats.history["reward/mean"][:2] == [0.0, 1.0]  # the kept groups start the history


def test_a_latency_breakdown_times_each_written_group_from_its_start_to_its_sinks(tmp_path) -> None:
    """With `latency_ledgers`, each written group's ledger holds what its task timed and what the
    runner did with it (queued, check, sinks); a failed group has none."""
    from opd import latency

    class TimedEnv(ScriptedEnv):
        async def collect_trajectories(self, item: int):
            with latency.phase("request"):
                return await super().collect_trajectories(item)

    class SlowSink(Sink):
        async def write(self, written: Written) -> None:
            await asyncio.sleep(0.03)

    ledgers: list = []
    limits = RunnerLimits(groups_in_flight=2, max_attempts_per_item=1, max_failed_groups=10)

    async def main():
        env = TimedEnv(fail=lambda item, attempt: item == 1, delay=0.05)
        return await Runner(env, [SlowSink()], 3, limits, progress=False, latency_ledgers=ledgers).run()

    stats = asyncio.run(main())
    assert stats.written == 3 and stats.failed == 1 and len(ledgers) == 3
    for ledger, written_at in ledgers:
        assert ledger.phases["request"] >= 0.045 and ledger.phases["sinks"] >= 0.025  # timers may fire a little early
        assert {"queued", "check"} <= set(ledger.phases)
        assert written_at - ledger.started >= 0.07  # from the group's start to its sinks' end
    means = latency.breakdown(ledgers)
    assert means["total"] >= means["request"] + means["sinks"]


def test_groups_that_finish_together_each_start_their_replacement_before_the_next_is_written() -> None:
    """Rounds of requests end together: the replacement of the first finished group must be
    collecting (its prompt, its requests) before the second finished group is checked and written."""
    events: list[str] = []
    both_started: list[asyncio.Event] = []

    class Together(ScriptedEnv):
        async def collect_trajectories(self, item: int):
            events.append(f"start {item}")
            if not both_started:
                both_started.append(asyncio.Event())
            if item == 1:
                both_started[0].set()  # items 0 and 1 end in the same turn of the loop
            await (both_started[0].wait() if item < 2 else asyncio.sleep(0.01))
            return group_for(item), []

    class Log(Sink):
        async def write(self, written: Written) -> None:
            events.append(f"write {written.group['scores'][0]:g}")

    asyncio.run(Runner(Together(), [Log()], 4, RunnerLimits(2, 1, 0), progress=False).run())
    assert events[:2] == ["start 0", "start 1"]
    first, second = [i for i, e in enumerate(events) if e.startswith("write")][:2]  # 0 and 1, in either order
    assert "start 2" in events[first:second], events
    assert sorted(e for e in events if e.startswith("write")) == ["write 0", "write 1", "write 2", "write 3"]


def test_progress_lines_every_n_groups_and_while_none_is_written(caplog: pytest.LogCaptureFixture) -> None:
    """Besides the console bar: a line every `every` written groups (and at the last), published
    (the MLflow tag) and in the log file only while the bar shows; while no group is written for
    `quiet_after_s`, a line every `quiet_after_s` saying so, with the oldest group's age and the
    requests' state."""
    import logging

    from opd.runner import Progress

    class SlowItem(ScriptedEnv):
        async def collect_trajectories(self, item: int):
            self.delay = 0.7 if item == 3 else 0.01  # one group that keeps the run quiet
            return await super().collect_trajectories(item)

    published: list[str] = []
    report = Progress(every=2, quiet_after_s=0.2, publish=published.append, requests=lambda: "3 in flight, 1 retried, 0 failed for good")

    async def main():
        return await Runner(SlowItem(), [], 5, RunnerLimits(1, 1, 0), progress=False, report=report).run()

    with caplog.at_level(logging.INFO, logger="opd.runner"):
        asyncio.run(main())
    lines = [r for r in caplog.records if r.name == "opd.runner"]
    assert all(getattr(r, "file_only", False) for r in lines)  # the console has its bar
    said = [r.getMessage() for r in lines]
    every = [line for line in said if "none written" not in line]
    assert [line.split(" written")[0] for line in every] == ["groups: 2 of 5", "groups: 4 of 5", "groups: 5 of 5"], said
    assert "ETA" in every[0] and "ETA" not in every[-1] and "(0 failed, 0 dropped, " in every[0]
    quiet = [line for line in said if "none written" in line]
    # Item 3 (the 4th group) took 0.7 s: two or three lines 0.2 s apart, after the 3rd group.
    assert 2 <= len(quiet) <= 4, said
    assert all(q.startswith("groups: 3 of 5 written") and "the oldest group in flight started" in q
               and q.endswith("requests: 3 in flight, 1 retried, 0 failed for good") for q in quiet), quiet
    assert published == said
    # A publisher that fails never fails the run: the first failure is said, every one counted.
    caplog.clear()

    def broken(line: str) -> None:
        raise ConnectionError("tracking store gone")

    async def unpublished():
        runner = Runner(ScriptedEnv(), [], 3, RunnerLimits(1, 1, 0), progress=False, report=Progress(every=1, quiet_after_s=None, publish=broken))
        await runner.run()
        return runner

    with caplog.at_level(logging.INFO, logger="opd.runner"):
        runner = asyncio.run(unpublished())
    assert runner.unpublished == 3 and runner.stats.written == 3
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == ["progress line not published (1 so far; the run goes on): tracking store gone"], warned
    # Without a bar the lines go to the console too.
    caplog.clear()
    report = Progress(every=5, quiet_after_s=None, console=True)

    async def bare():
        return await Runner(ScriptedEnv(), [], 5, RunnerLimits(2, 1, 0), progress=False, report=report).run()

    with caplog.at_level(logging.INFO, logger="opd.runner"):
        asyncio.run(bare())
    (line,) = [r for r in caplog.records if r.name == "opd.runner"]
    assert line.getMessage().startswith("groups: 5 of 5 written") and not getattr(line, "file_only", False)
