"""\\boxed{} extraction and answer verification."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opd.rewards.boxed import boxed_contents, final_answer
from opd.data.math_sets import is_plain_number
from opd.rewards.math import answers_match


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


@pytest.mark.parametrize(
    ("predicted", "reference", "expected"),
    [("42", "42", True), ("1,000", "1000", True), ("0.5", "1/2", True), (r"\frac{1}{2}", "0.5", True),
     (r"\tfrac{1}{3}", r"\frac{1}{3}", True), ("41", "42", False), ("", "42", False), (None, "42", False),
     ("4" * 500, "4", False)],
)
def test_answers_match_equivalent_forms(predicted: str | None, reference: str, expected: bool) -> None:
    assert answers_match(predicted, reference) is expected


@pytest.mark.parametrize(("answer", "numeric"), [("42", True), ("-3.5", True), ("1,000", True), ("2+3", False), ("1/3", False), (r"\sqrt{2}", False), ("", False)])
def test_numeric_filter_admits_only_plain_numbers(answer: str, numeric: bool) -> None:
    assert is_plain_number(answer) is numeric


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("\\boxed{}</think> 12")), max_size=2000))
def test_extraction_never_raises_and_is_fast(text: str) -> None:
    started = time.monotonic()
    final_answer(text)
    boxed_contents(text)
    assert time.monotonic() - started < 0.5
