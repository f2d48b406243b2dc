"""Rewards: the rubric (raw signals, one weighted sum) and each signal of each environment."""

from __future__ import annotations

import pytest

from conftest import compose
from opd.config import validate
from opd.rewards import coding, math
from opd.rewards.rubric import Rubric, Signals


def test_the_rubric_weighs_raw_signals_and_keeps_them() -> None:
    signals: Signals[int] = Signals()

    @signals.add
    def double(x: int, params: object) -> float:
        return 2.0 * x

    @signals.add
    def one(x: int, params: object) -> float:
        return 1.0

    scored = Rubric(signals, {"double": 0.5, "one": -3.0}).score(4)
    assert scored.signals == {"double": 8.0, "one": 1.0} and scored.total == pytest.approx(0.5 * 8 - 3)
    with pytest.raises(ValueError, match="missing \\['one'\\], unknown \\['two'\\]"):
        Rubric(signals, {"double": 1.0, "two": 1.0})


def test_config_weights_name_the_signals_one_to_one() -> None:
    # Adding a signal means adding its weight (and the reverse): the rubric refuses otherwise.
    for env, module in (("inline_math", math), ("opd_coding", coding)):
        cfg = validate(compose([f"env={env}"]))
        assert Rubric(module.SIGNALS, cfg.reward.weights).weights.keys() == set(module.SIGNALS.names)


# ---- inline_math ------------------------------------------------------------------------

def outcome(text: str = "<think>x</think> \\boxed{5}", tools: int = 0, correct: bool = True) -> math.MathOutcome:
    return math.MathOutcome(text, tools, correct)


def test_correct_and_incorrect_read_the_verified_answer() -> None:
    assert (math.correct(outcome(correct=True)), math.incorrect(outcome(correct=True))) == (1.0, 0.0)
    assert (math.correct(outcome(correct=False)), math.incorrect(outcome(correct=False))) == (0.0, 1.0)


def test_tool_use_needs_a_correct_answer_and_a_tool() -> None:
    assert math.tool_use(outcome(tools=1, correct=True)) == 1.0
    assert math.tool_use(outcome(tools=0, correct=True)) == 0.0
    assert math.tool_use(outcome(tools=2, correct=False)) == 0.0


@pytest.mark.parametrize(("text", "violation"), [
    ("<think>a</think> \\boxed{1}", 0.0),
    ("<think>never closed \\boxed{1}", 1.0),
    ("<think>a</think> <tool_call>{}</tool_call>", 1.0),
    ("<think>a</think> <tool_response>{}</tool_response>", 1.0),
    ("<think><tool_call>{}</tool_call><tool_response>{}</tool_response></think> \\boxed{1}", 0.0),
])
def test_format_violation(text: str, violation: float) -> None:
    assert math.format_violation(outcome(text)) == violation


def test_check_answer_reads_the_last_box_after_think() -> None:
    from opd.event_loop import run_loop
    from opd.rewards.verifier import Verifier

    verifier = Verifier(workers=1)
    try:
        assert run_loop(math.check_answer("<think>\\boxed{4}</think> \\boxed{0.5}", "\\frac{1}{2}", verifier, 200)) is True
        assert run_loop(math.check_answer("<think>\\boxed{5}</think> no box", "5", verifier, 200)) is False
    finally:
        verifier.close()


def test_math_weights_make_the_scores_of_the_reference() -> None:
    rubric = Rubric(math.SIGNALS, validate(compose()).reward.weights)
    assert rubric.score(outcome(tools=1)).total == pytest.approx(1.2)
    assert rubric.score(outcome(correct=False)).total == pytest.approx(-1.0)
    assert rubric.score(outcome("<think>no end \\boxed{5}", correct=False)).total == pytest.approx(-3.0)


# ---- opd_coding --------------------------------------------------------------------------

REWARD = validate(compose(["env=opd_coding"])).reward


def coding_outcome(tests: str = "pass", turns: int = 3, tools: tuple[str, ...] = ("write_file", "terminal")) -> coding.CodingOutcome:
    return coding.CodingOutcome(tests, turns, 15, tools)


@pytest.mark.parametrize(("tests", "value"), [("pass", 1.0), ("assertion", 0.2), ("crash", 0.1), ("nothing_written", 0.0)])
def test_correctness_is_the_level_of_the_tests(tests: str, value: float) -> None:
    assert coding.correctness(coding_outcome(tests), REWARD) == value


@pytest.mark.parametrize(("turns", "value"), [(1, 1.0), (3, 1.0), (4, 0.8), (7, 0.8), (8, 0.5), (11, 0.5), (12, 0.2), (15, 0.2)])
def test_efficiency_steps_down_with_turns(turns: int, value: float) -> None:
    assert coding.efficiency(coding_outcome(turns=turns), REWARD) == value


@pytest.mark.parametrize(("tools", "value"), [
    (("write_file", "terminal"), 1.0), (("patch", "terminal"), 1.0), (("terminal",), 0.6), (("read_file",), 0.3), ((), 0.0),
])
def test_tool_usage_credits_writing_and_running(tools: tuple[str, ...], value: float) -> None:
    assert coding.tool_usage(coding_outcome(tools=tools), REWARD) == value
