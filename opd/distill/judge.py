"""The hindsight judge: votes on one turn pair, a decision rule and the choice of hint.

A vote counts only when the judge finished it: one cut off at `max_tokens` may stop inside a
quote, so it is discarded (unparseable) and counted. A vote whose hint repeats text the policy put
between hint markers in the turn or the state, exactly or nearly (however it spelt the markers and
the hint: look-alike or invisible characters, case, spacing and punctuation do not count, and a
word added or changed in five does not make it the judge's own: `planted_copy`) is the policy's
verdict, not the judge's: it is discarded too (unparseable) and counted.

The decision rule weighs recall against robustness: `any` (the reference's) hints a turn when one
vote of `votes` says 1, so it hints the most turns, but one vote that the policy's text steered
decides and its hint can win; `majority` needs more 1 than -1 among parseable votes, so a policy
must steer most votes; `unanimous` hints only what every vote agrees on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from opd.config import JudgeConfig
from opd.distill.judge_prompt import Vote, judge_messages, parse_vote, planted_copy, quoted_hints
from opd.distill.turn_pairs import TurnPair
from opd.serving.vllm_client import ChatReply

logger = logging.getLogger(__name__)

# (messages, n, max_tokens, temperature) -> the n replies; None for a vote whose request failed
ChatFn = Callable[[list[dict[str, str]], int, int, float], Awaitable[list[ChatReply | None]]]
# The finish reason of a reply cut at max_tokens (OpenAI's and vLLM's word).
CUT_OFF = "length"


@dataclass
class Judgement:
    votes: list[Vote] = field(default_factory=list)
    decision: int | None = None  # 1: use a hint; -1: no hindsight; None: no parseable vote
    hint: str | None = None
    failed: int = 0  # votes whose request failed (each also counts as unparseable, as in the reference)
    cut_off: int = 0  # votes cut off at max_tokens (each also counts as unparseable)
    planted: int = 0  # votes discarded because their hint is (nearly) one the policy wrote between hint markers

    @property
    def unparseable(self) -> int:
        return sum(v.decision is None for v in self.votes)


def decide(votes: list[Vote], rule: str) -> int | None:
    """majority: more 1 than -1 among parseable votes; any: one 1 is enough; unanimous: all 1."""
    parsed = [v.decision for v in votes if v.decision is not None]
    if not parsed:
        return None
    positive = parsed.count(1)
    if rule == "any":
        return 1 if positive else -1
    if rule == "unanimous":
        return 1 if positive == len(parsed) else -1
    return 1 if positive > len(parsed) - positive else -1


def choose_hint(votes: list[Vote], min_chars: int, choice: str) -> str | None:
    """Among positive votes with a hint longer than `min_chars`: the longest, or the first."""
    hints = [v.hint for v in votes if v.decision == 1 and len(v.hint.strip()) > min_chars]
    if not hints:
        return None
    return max(hints, key=len) if choice == "longest" else hints[0]


async def judge_pair(pair: TurnPair, chat: ChatFn, cfg: JudgeConfig) -> Judgement:
    """Ask for `cfg.votes` verdicts; raises what the server raised."""
    messages = judge_messages(pair.response_text, pair.next_state_text, pair.next_state_role)
    replies = await chat(messages, cfg.votes, cfg.max_tokens, cfg.temperature)
    planted = quoted_hints(pair.response_text) | quoted_hints(pair.next_state_text)
    judgement = Judgement(failed=sum(r is None for r in replies), cut_off=sum(r is not None and r.finish_reason == CUT_OFF for r in replies))
    for reply in replies:
        vote = Vote(None, "") if reply is None or reply.finish_reason == CUT_OFF else parse_vote(reply.text)
        if vote.hint and planted_copy(vote.hint, planted):  # the policy's verdict, repeated: not a vote of the judge's
            judgement.planted += 1
            vote = Vote(None, "")
        judgement.votes.append(vote)
    if judgement.cut_off or judgement.planted:
        logger.debug("judge: %d of %d votes cut off at max_tokens=%d, %d votes with a planted hint discarded", judgement.cut_off, len(replies), cfg.max_tokens, judgement.planted)
    judgement.decision = decide(judgement.votes, cfg.decision_rule)
    if judgement.decision == 1:
        judgement.hint = choose_hint(judgement.votes, cfg.min_hint_chars, cfg.hint_choice)
    return judgement
