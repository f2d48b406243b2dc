"""inline_math reward signals: small named functions whose sum is the score.

Names match the config keys under `reward.weights`: `correctness` gives `correct` or
`incorrect`, `tool_use` gives the bonus, `format` gives `format_violation`.
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass

from opd.rewards.boxed import final_answer

logger = logging.getLogger(__name__)

_NUMBER = re.compile(r"[-+]?\d+(\.\d+)?")


@dataclass(frozen=True)
class MathOutcome:
    """What the reward needs to know about one finished rollout."""

    text: str  # the assistant turn's generated text, tool responses included
    tool_calls_run: int  # tool calls that were executed (well-formed, within the limit)


def is_plain_number(answer: str) -> bool:
    """True for `42`, `-3`, `2.5`; False for `2+3`, `1/3`, `\\sqrt{2}` (dataset filter)."""
    return _NUMBER.fullmatch(answer.strip().replace(",", "")) is not None


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


def correctness(outcome: MathOutcome, reference: str, correct: float, incorrect: float, max_chars: int, timeout_s: float) -> float:
    """`correct` when the last `\\boxed{}` after `</think>` verifies, else `incorrect`."""
    return correct if answers_match(final_answer(outcome.text), reference, max_chars, timeout_s) else incorrect


def tool_use(outcome: MathOutcome, is_correct: bool, bonus: float) -> float:
    """`bonus` for a correct answer that used at least one tool."""
    return bonus if is_correct and outcome.tool_calls_run > 0 else 0.0


def format_violation(outcome: MathOutcome, penalty: float) -> float:
    """`penalty` when `</think>` is missing or a tool call/response follows it."""
    end = outcome.text.find("</think>")
    if end == -1:
        return penalty
    after = outcome.text[end:]
    return penalty if "<tool_call>" in after or "<tool_response>" in after else 0.0
