"""inline_math's reward: answer checking and the signals (names match `reward.weights`).

- `correct`: the last `\\boxed{}` after `</think>` verifies against the reference (math-verify:
  equivalent forms count, `0.5` = `\\frac{1}{2}`); `incorrect`: it does not, or there is none.
- `tool_use`: a correct answer that used at least one tool.
- `format_violation`: `</think>` is missing, or a tool call or response follows it.
Each is 1.0 when it applies, else 0.0; the weights make the score.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opd.rewards.boxed import final_answer
from opd.rewards.rubric import FlatPenalty, PassRule, Rubric, Signals
from opd.rewards.verifier import Verifier

if TYPE_CHECKING:
    from opd.config import InlineMathRewardConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MathOutcome:
    """What the signals need to know about one finished rollout."""

    text: str  # the assistant turn's text the model wrote (inserted tool responses left out)
    tool_calls_run: int  # tool calls that were executed (well-formed, within the limit)
    answer_correct: bool  # the final answer verified against the reference
    # Text that marks tool use after </think> (the format's call start and response marker).
    tool_markers: tuple[str, ...] = ("<tool_call>", "<tool_response>")
    # Text that ends the reasoning; the answer follows it (gpt-oss: its final channel).
    reasoning_end: str = "</think>"


_THOUSANDS = re.compile(r"[-+]?\d{1,3}(,\d{3})+(\.\d+)?")


def normalise(answer: str) -> str:
    """The answer without surrounding space, and without thousands separators where they are
    separators (`1,000` -> `1000`; `1,5` and `2,3` stay as they are)."""
    answer = answer.strip()
    return answer.replace(",", "") if _THOUSANDS.fullmatch(answer) else answer


async def check_answer(text: str, reference: str, verifier: Verifier, max_chars: int, reasoning_end: str = "</think>") -> bool | None:
    """Does the last `\\boxed{}` after `reasoning_end` match `reference`? Equal after `normalise`,
    equal as integers (`007` = `7`), or equivalent by math-verify (`0.5` = `\\frac{1}{2}`) in the
    verifier's workers. Answers longer than `max_chars` are refused (False); None when
    math-verify timed out (not verified)."""
    predicted = final_answer(text, reasoning_end)
    if predicted is None or not predicted.strip() or len(predicted) > max_chars:
        return False
    if normalise(predicted) == normalise(reference):
        return True
    whole, expected = integer(normalise(predicted)), integer(normalise(reference))
    if whole is not None and expected is not None:
        return whole == expected  # what math-verify says of two integers, without its round trip
    return await verifier.matches(predicted, reference)


_INTEGER = re.compile(r"([-+]?)0*([0-9]+)")


def integer(answer: str) -> str | None:
    """`answer` as a canonical integer (no plus sign, no leading zeros, `-0` is `0`), or None
    when it is not one (ASCII digits, an optional sign; strings, so no int() of 10,000 digits)."""
    found = _INTEGER.fullmatch(answer)
    if found is None:
        return None
    sign, digits = found.groups()
    return digits if sign != "-" or digits == "0" else "-" + digits


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
    end = outcome.text.find(outcome.reasoning_end)
    if end == -1:
        return 1.0
    after = outcome.text[end:]
    return float(any(marker in after for marker in outcome.tool_markers))


def rubric(cfg: InlineMathRewardConfig) -> Rubric[MathOutcome]:
    """inline_math's whole score: the weighted signals, and with `format_penalty=flat` a format
    violation scoring `flat_format_score` whatever else the rollout did (the reference's -1)."""
    penalty = FlatPenalty("format_violation", cfg.flat_format_score) if cfg.format_penalty == "flat" else None
    return Rubric(SIGNALS, cfg.weights, penalty=penalty, passing=PassRule("correct", 1.0))
