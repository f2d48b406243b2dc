"""Latency ledgers: phases land in the ledger of the group or rollout that ran them, and the
breakdown adds up to each rollout's latency."""

from __future__ import annotations

import asyncio

import pytest

from opd import latency
from opd.latency import Ledger, breakdown, phase, rollout_phases


def test_without_a_ledger_a_phase_records_nothing() -> None:
    async def main() -> None:
        assert latency.current() is None
        with phase("request"):
            await asyncio.sleep(0)
        with latency.rollout():
            assert latency.current() is None

    asyncio.run(main())


def test_phases_go_to_the_ledger_of_the_task_that_ran_them() -> None:
    group = Ledger()

    async def one(seconds: float) -> None:
        with latency.rollout():
            with phase("request"):
                await asyncio.sleep(seconds)

    async def collect() -> None:
        await asyncio.gather(one(0.05), one(0.15))
        with phase("reward"):
            with phase("verify"):
                await asyncio.sleep(0.02)

    asyncio.run(latency.within(group, collect()))
    short, long = group.rollouts
    # Each ledger has its own request (no sleep ends early; a late timer on a loaded machine only
    # adds to both): swapped or pooled phases fail one of these.
    assert short.phases["request"] >= 0.04 and long.phases["request"] >= 0.14 and short.phases["request"] < long.phases["request"]
    assert set(group.phases) == {"reward", "reward/verify"}  # the rollouts' requests are theirs, not the group's
    assert group.phases["reward"] >= group.phases["reward/verify"] >= 0.015
    assert short.ended < long.ended <= group.ended


def test_breakdown_adds_up_to_each_rollouts_latency() -> None:
    group = Ledger(started=10.0, phases={"check": 0.01, "sinks": 0.02, "reward/verify": 0.005})
    group.rollouts = [Ledger(started=10.0, ended=10.3, phases={"request": 0.2}), Ledger(started=10.0, ended=10.5, phases={"request": 0.4})]
    first, second = rollout_phases(group, finished=10.6)
    assert first["group_wait"] == pytest.approx(0.2) and second["group_wait"] == pytest.approx(0.0)
    for row in (first, second):
        assert row["total"] == pytest.approx(0.6)
        top_level = sum(seconds for name, seconds in row.items() if "/" not in name and name not in ("other", "total"))
        assert top_level + row["other"] == pytest.approx(row["total"])  # the nested verify is inside, not beside
    means = breakdown([(group, 10.6)])
    assert list(means)[:5] == ["request", "group_wait", "check", "sinks", "reward/verify"]
    assert means["request"] == pytest.approx(300) and means["other"] == pytest.approx(170) and means["total"] == pytest.approx(600)
    assert breakdown([]) == {}


def test_a_workers_ledger_joins_the_drivers_with_the_rest_as_transfer() -> None:
    """An environment worker times its part of a group on its own clock; the driver adds it as
    if it ended when the group arrived, and the remaining wait is the Ray call's `transfer`."""
    remote = Ledger(started=500.0, ended=500.4, phases={"reward": 0.05})
    remote.rollouts = [Ledger(started=500.0, ended=500.3, phases={"request": 0.25}), Ledger(started=500.0, ended=500.35, phases={"request": 0.3})]
    driver = Ledger(started=10.0)
    latency.absorb(driver, latency.export(remote), received=10.5)
    assert driver.phases["reward"] == 0.05 and driver.phases["transfer"] == pytest.approx(0.1)
    assert [r.phases for r in driver.rollouts] == [{"request": 0.25}, {"request": 0.3}]
    assert [round(r.ended, 6) for r in driver.rollouts] == [10.4, 10.45]
    first, second = rollout_phases(driver, finished=10.6)
    assert first["group_wait"] == pytest.approx(0.05) and first["total"] == pytest.approx(0.6)
    assert first["other"] == pytest.approx(0.6 - 0.25 - 0.05 - 0.1 - 0.05)
