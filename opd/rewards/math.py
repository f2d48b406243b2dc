"""inline_math's reward: answer checking and the signals (names match `reward.weights`).

- `correct`: the last `\\boxed{}` after `</think>` verifies against the reference (math-verify:
  equivalent forms count, `0.5` = `\\frac{1}{2}`); `incorrect`: it does not, or there is none.
- `tool_use`: a correct answer that used at least one tool.
- `format_violation`: `</think>` is missing, or a tool call or response follows it.
Each is 1.0 when it applies, else 0.0; the weights make the score.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

from opd.rewards.boxed import final_answer
from opd.rewards.rubric import Signals

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MathOutcome:
    """What the signals need to know about one finished rollout."""

    text: str  # the assistant turn's generated text, tool responses included
    tool_calls_run: int  # tool calls that were executed (well-formed, within the limit)
    answer_correct: bool  # the final answer verified against the reference


def answers_match(predicted: str | None, reference: str, max_chars: int = 200, timeout_s: float = 5.0) -> bool:
    """math-verify equivalence (`0.5` = `\\frac{1}{2}`), with an exact-string fast path.

    Answers longer than `max_chars` are refused (False); the verifier's own timeouts bound the
    rest. Never raises.
    """
    if predicted is None or not predicted.strip() or len(predicted) > max_chars:
        return False
    if predicted.strip().replace(",", "") == reference.strip().replace(",", ""):
        return True
    return _verified(predicted, reference, max(1, int(round(timeout_s))))


@functools.lru_cache(maxsize=8192)
def _verified(predicted: str, reference: str, timeout: int) -> bool:
    """math-verify, cached: a group's rollouts often give the same answer, and it costs ~2 ms."""
    try:
        from math_verify import parse, verify

        gold = parse(f"${reference}$", parsing_timeout=timeout)
        guess = parse(f"${predicted}$", parsing_timeout=timeout)
        return bool(gold and guess and verify(gold, guess, timeout_seconds=timeout))
    except Exception as err:  # the verifier raises a variety of parse errors on hostile input
        logger.debug("math-verify failed on %r: %s", predicted[:80], err)
        return False


def is_correct(text: str, reference: str, max_chars: int, timeout_s: float) -> bool:
    """The last boxed answer after `</think>` verifies against `reference`."""
    return answers_match(final_answer(text), reference, max_chars, timeout_s)


SIGNALS: Signals[MathOutcome] = Signals()


@SIGNALS.add
def correct(outcome: MathOutcome, params: object = None) -> float:
    return float(outcome.answer_correct)


@SIGNALS.add
def incorrect(outcome: MathOutcome, params: object = None) -> float:
    return float(not outcome.answer_correct)


@SIGNALS.add
def tool_use(outcome: MathOutcome, params: object = None) -> float:
    return float(outcome.answer_correct and outcome.tool_calls_run > 0)


@SIGNALS.add
def format_violation(outcome: MathOutcome, params: object = None) -> float:
    end = outcome.text.find("</think>")
    if end == -1:
        return 1.0
    after = outcome.text[end:]
    return float("<tool_call>" in after or "<tool_response>" in after)
