"""Rewards: the rubric (raw signals, one weighted sum, the rules on the total) and each signal of
each environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import compose
from opd.config import validate
from opd.rewards import coding, math
from opd.rewards.rubric import FlatPenalty, PassRule, Rubric, Signals


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


def test_the_rubric_owns_the_whole_score_penalty_then_clamp_and_the_pass_rule() -> None:
    signals: Signals[dict] = Signals()

    @signals.add
    def good(x: dict, params: object) -> float:
        return x["good"]

    @signals.add
    def broken(x: dict, params: object) -> float:
        return x["broken"]

    rubric = Rubric(signals, {"good": 3.0, "broken": -1.0}, penalty=FlatPenalty("broken", -5.0), clamp=(-2.0, 2.0),
                    passing=PassRule("good", 0.8))
    assert rubric.score({"good": 0.5, "broken": 0.0}).total == 1.5
    assert rubric.score({"good": 1.0, "broken": 0.0}).total == 2.0  # clamped from 3
    flat = rubric.score({"good": 1.0, "broken": 1.0})
    assert flat.total == -2.0 and flat.signals == {"good": 1.0, "broken": 1.0}  # the penalty (-5), then the clamp
    assert rubric.passed({"good": 0.8, "broken": 1.0}) and not rubric.passed({"good": 0.79, "broken": 0.0})
    with pytest.raises(ValueError, match="reward.format_penalty: the rubric has no signal 'missing'"):
        Rubric(signals, {"good": 1.0, "broken": 1.0}, penalty=FlatPenalty("missing", -1.0))
    with pytest.raises(ValueError, match="reward.pass_threshold: the rubric has no signal 'correctness'"):
        Rubric(signals, {"good": 1.0, "broken": 1.0}, passing=PassRule("correctness", 0.8))


def test_each_envs_config_builds_the_rubric_of_its_whole_score() -> None:
    flat = math.rubric(validate(compose(["env=inline_math"])).reward)
    violation = outcome("<think>no end \\boxed{5}", correct=True)
    assert flat.score(violation).total == -1.0  # the reference's flat -1, whatever else it did
    additive = math.rubric(validate(compose(["env=inline_math", "reward.format_penalty=additive"])).reward)
    assert additive.score(violation).total == pytest.approx(1.0 - 2.0)
    clamped = coding.rubric(REWARD)
    assert clamped.clamp == (0.0, 1.0) and clamped.passing == PassRule("correctness", 0.8)
    strict = coding.rubric(validate(compose(["env=opd_coding", "reward.pass_threshold=1.0", "reward.clamp=null"])).reward)
    assert strict.clamp is None and not strict.passed({"correctness": 0.9}) and strict.passed({"correctness": 1.0})


def test_a_weight_without_its_signal_fails_before_any_server_starts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Adding a signal means adding its weight: the run stops at the preflight, naming
    reward.weights, instead of after vLLM's start-up when the environment is built."""
    from opd.config import ConfigError
    from opd.experiment import run_experiment
    from opd.serving import local_vllm

    grown: Signals[math.MathOutcome] = Signals()
    for name, fn in math.SIGNALS:
        grown.add(fn)

    @grown.add
    def brevity(outcome: math.MathOutcome, params: object) -> float:
        return 0.0

    monkeypatch.setattr(math, "SIGNALS", grown)

    def no_server(self: object) -> str:
        raise AssertionError("a server was started before the rubric was checked")

    monkeypatch.setattr(local_vllm.LocalVLLM, "start", no_server)
    with pytest.raises(ConfigError, match=r"reward.weights must name the signals .* \(missing \['brevity'\]") as err:
        run_experiment(validate(compose(["env=inline_math", "tracking.enabled=false", f"output_dir={tmp_path}"])))
    assert err.value.key == "reward.weights"


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
