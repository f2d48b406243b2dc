"""The generation loop with a scripted env: isolation, retries, bounded failures, concurrency."""

from __future__ import annotations

import asyncio

import pytest

from opd.records import MASK, MASKED_LOGPROB, GroupWriter, read_groups
from opd.runner import TooManyFailures, run_generation


def group_for(item: int) -> dict:
    return {
        "tokens": [[1, 2, item + 3]],
        "masks": [[MASK, MASK, item + 3]],
        "scores": [float(item)],
        "inference_logprobs": [[MASKED_LOGPROB, MASKED_LOGPROB, -0.5]],
        "overrides": [{}],
    }


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


def run(env: ScriptedEnv, tmp_path, total: int, **kwargs):
    path = tmp_path / "groups.jsonl"
    params = {"groups_in_flight": 4, "max_attempts_per_item": 2, "max_failed_groups": 10, "progress": False, **kwargs}
    with GroupWriter(path) as writer:
        stats = asyncio.run(run_generation(env, writer, total, **params))
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


def test_metrics_are_reported_per_written_group(tmp_path) -> None:
    seen: list[tuple[int, dict]] = []
    env = ScriptedEnv()
    path = tmp_path / "g.jsonl"
    with GroupWriter(path) as writer:
        asyncio.run(run_generation(env, writer, 3, groups_in_flight=2, max_attempts_per_item=1, max_failed_groups=0, on_metrics=lambda m, s: seen.append((s, m)), progress=False))
    assert [s for s, _ in seen] == [1, 2, 3]
    assert all("runner/groups_per_s" in m and "reward/mean" in m for _, m in seen)
