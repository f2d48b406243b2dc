"""\\boxed{} extraction and answer verification."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opd.rewards.boxed import boxed_contents, final_answer
from opd.data.math_sets import is_plain_number
from opd.event_loop import run_loop
from opd.rewards.math import check_answer, normalise
from opd.rewards.verifier import Verifier


def test_nested_braces_and_order() -> None:
    text = r"so \boxed{\tfrac{1}{3}} or \boxed {x^{2}} and \boxed{unclosed"
    assert boxed_contents(text) == [r"\tfrac{1}{3}", "x^{2}"]


def test_final_answer_only_after_think() -> None:
    assert final_answer(r"<think>\boxed{1}</think> The answer is \boxed{2}.") == "2"
    assert final_answer(r"<think>\boxed{1} no close") is None
    assert final_answer(r"</think> nothing boxed") is None
    assert final_answer(r"</think> \boxed{1} then \boxed{3}") == "3"


def test_escaped_braces_do_not_count() -> None:
    assert boxed_contents(r"\boxed{\{1,2\}}") == [r"\{1,2\}"]


@pytest.fixture(scope="module")
def verifier():
    checker = Verifier(workers=1, timeout_s=5)
    yield checker
    checker.close()


@pytest.mark.parametrize(
    ("predicted", "reference", "expected"),
    [("42", "42", True), ("1,000", "1000", True), ("12,345,678", "12345678", True), ("0.5", "1/2", True), (r"\frac{1}{2}", "0.5", True),
     (r"\tfrac{1}{3}", r"\frac{1}{3}", True), ("41", "42", False), ("", "42", False), (None, "42", False),
     ("4" * 500, "4", False), ("1,5", "15", False), ("2,3", "23", False), ("1,00", "100", False)],
)
def test_answers_match_equivalent_forms(verifier, predicted: str | None, reference: str, expected: bool) -> None:
    text = "<think>x</think>" + (f"\\boxed{{{predicted}}}" if predicted is not None else "no answer")
    assert run_loop(check_answer(text, reference, verifier, 200)) is expected


def test_thousands_separators_are_dropped_only_where_they_separate_thousands() -> None:
    assert [normalise(a) for a in ("1,000", " -12,345.5 ", "1,5", "2,3", "1,0000", "1,000,00")] == ["1000", "-12345.5", "1,5", "2,3", "1,0000", "1,000,00"]


@pytest.mark.parametrize(("answer", "numeric"), [("42", True), ("-3.5", True), ("1,000", True), ("1,5", False), ("2+3", False), ("1/3", False), (r"\sqrt{2}", False), ("", False)])
def test_numeric_filter_admits_only_plain_numbers(answer: str, numeric: bool) -> None:
    assert is_plain_number(answer) is numeric


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("\\boxed{}</think> 12")), max_size=2000))
def test_extraction_never_raises_and_is_fast(text: str) -> None:
    started = time.thread_time()  # CPU time: what the extraction computed, not the machine's load
    final_answer(text)
    boxed_contents(text)
    assert time.thread_time() - started < 0.5


def test_a_hostile_answer_times_out_in_its_worker_without_stalling_the_run() -> None:
    import asyncio

    verifier = Verifier(workers=1, timeout_s=1.0)

    async def main() -> tuple[bool | None, float, bool | None]:
        gaps, last, done = [], time.monotonic(), asyncio.Event()

        async def tick() -> None:
            nonlocal last
            while not done.is_set():
                await asyncio.sleep(0.01)
                gaps.append(time.monotonic() - last)
                last = time.monotonic()

        ticker = asyncio.create_task(tick())
        await verifier.matches("1", "1")  # start the worker first: its start is not the check
        hostile = await verifier.matches("9^{9^{9^{9}}}", "7")
        done.set()
        await ticker
        after = await verifier.matches("0.5", "\\frac{1}{2}")
        return hostile, max(gaps), after

    try:
        hostile, longest_stall, after = run_loop(main())
    finally:
        verifier.close()
    assert hostile is None and verifier.timeouts == 1  # not verified, counted
    assert ("9^{9^{9^{9}}}", "7") not in verifier._cache  # a timeout is never cached
    # The event loop went on meanwhile: a loop held for the check would stall for its whole 1 s
    # timeout; a wall gap (a blocked wait uses no CPU) with room for a loaded machine's scheduling.
    assert longest_stall < 0.75
    assert after is True  # a fresh worker took over


def test_a_worker_that_never_gets_ready_fails_its_check_in_bounded_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker hung at start-up (e.g. its imports stuck) is killed after READY_TIMEOUT_S; the
    check raises instead of holding its group forever, and the next one starts a new worker."""
    import asyncio
    import sys

    from opd.rewards import verifier as verifier_module

    hung = [sys.executable, "-c", "import time; time.sleep(60)"]
    monkeypatch.setattr(verifier_module, "READY_TIMEOUT_S", 0.5)
    monkeypatch.setattr(verifier_module, "worker_command", lambda memory_mb, timeout_s: hung)
    checker = Verifier(workers=1, timeout_s=5)
    started = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match="did not start within 0.5 s"):
            asyncio.run(checker.matches("1", "1"))
        assert time.monotonic() - started < 10
        monkeypatch.undo()
        assert asyncio.run(checker.matches("0.5", "\\frac{1}{2}")) is True
    finally:
        checker.close()


def test_workers_started_ahead_answer_the_first_check_without_a_start() -> None:
    """`start()` starts every worker at once, warmed up: the first checks wait for no start."""
    import asyncio

    from opd import latency

    verifier = Verifier(workers=2, timeout_s=5)

    async def checks() -> None:
        await asyncio.gather(verifier.matches("0.5", "\\frac{1}{2}"), verifier.matches("2/4", "\\frac{1}{2}"))

    async def main() -> latency.Ledger:
        await verifier.start()
        ledger = latency.Ledger()
        await latency.within(ledger, checks())
        return ledger

    try:
        ledger = run_loop(main())
        assert len(verifier._workers) == 2 and all(w.process.poll() is None for w in verifier._workers)
    finally:
        verifier.close()
    assert "verify" in ledger.phases and "verify/worker_start" not in ledger.phases


def test_the_same_answer_asked_at_once_is_checked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    verifier = Verifier(workers=2, timeout_s=5)
    asked: list[tuple[str, str]] = []
    ask = verifier._ask

    async def counted(worker, key):
        asked.append(key)
        return await ask(worker, key)

    monkeypatch.setattr(verifier, "_ask", counted)

    async def main() -> list[bool | None]:
        return await asyncio.gather(*(verifier.matches("0.5", "\\frac{1}{2}") for _ in range(8)), verifier.matches("0.25", "\\frac{1}{2}"))

    try:
        results = run_loop(main())
    finally:
        verifier.close()
    assert results == [True] * 8 + [False]
    assert sorted(asked) == [("0.25", "\\frac{1}{2}"), ("0.5", "\\frac{1}{2}")]  # eight rollouts, one round trip


def test_close_stops_busy_workers_too() -> None:
    """A check still running when the run closes (e.g. a hostile answer) does not leave its
    worker process behind."""
    import asyncio

    verifier = Verifier(workers=1, timeout_s=30)

    async def main() -> tuple[object, bool | None]:
        await verifier.start()
        (worker,) = verifier._workers
        hostile = asyncio.ensure_future(verifier.matches("9^{9^{9^{9}}}", "7"))
        await asyncio.sleep(0.3)  # the worker is busy with it
        verifier.close()
        return worker, await asyncio.gather(hostile, return_exceptions=True)

    worker, _ = run_loop(main())
    assert worker.process.poll() is not None and not verifier._workers


@pytest.mark.parametrize(("predicted", "reference"), [("007", "7"), ("-0", "0"), ("+5", "5"), ("-3", "3"), ("12345678901234567", "12345678901234568"),
                                                      ("0", "00"), ("41", "42"), ("5", "5.0"), ("1e3", "1000")])
def test_integers_are_compared_without_a_round_trip_as_math_verify_compares_them(verifier, predicted: str, reference: str) -> None:
    class NoRoundTrip:
        async def matches(self, predicted: str, reference: str) -> bool | None:
            raise AssertionError("asked math-verify about two integers")

    text = f"<think>x</think>\\boxed{{{predicted}}}"
    by_math_verify = run_loop(verifier.matches(predicted, reference))
    both_integers = all(a.lstrip("+-").isdigit() for a in (predicted, reference))
    assert run_loop(check_answer(text, reference, NoRoundTrip() if both_integers else verifier, 200)) is by_math_verify
