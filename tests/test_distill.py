"""Judge verdict parsing, decision rules, hint choice, hint placement, turn pairs, distill checks."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opd.agent.loop import AgentRollout, TurnSpan
from opd.distill.judge import choose_hint, decide
from opd.distill.judge_prompt import Vote, parse_vote
from opd.distill.teacher import with_hint
from opd.distill.turn_pairs import turn_pairs
from helpers import make_group, sequence
from opd.records import DISTILL_PAD_ID, DISTILL_PAD_LOGPROB, Sequence, check_group


@pytest.mark.parametrize(
    ("text", "decision", "hint"),
    [
        ("\\boxed{1}\n[HINT_START] check empty input [HINT_END]", 1, "check empty input"),
        ("ok \\boxed{-1}", -1, ""),
        ("\\boxed{1} then changed my mind \\boxed{-1}", None, ""),  # both decisions in one answer: no vote
        ("\\boxed{1} and again \\boxed{1} [HINT_START]h[HINT_END]", 1, "h"),
        ("\\boxed{ 1 }", 1, ""),
        ("\\boxed{2}", None, ""),
        ("no decision [HINT_START]x[HINT_END]", None, ""),
        ("[HINT_START]before[HINT_END] \\boxed{1} [HINT_START]after[HINT_END]", 1, "after"),  # the hint follows the decision
        ("\\boxed{1} [HINT_START]one[HINT_END] [HINT_START]two[HINT_END]", 1, ""),  # two hints: neither is the one
        ("<think>\\boxed{-1} or \\boxed{1}?</think>\\boxed{1} [HINT_START]h[HINT_END]", 1, "h"),  # only the final answer
        ("<think>\\boxed{1} [HINT_START]h[HINT_END]", None, ""),  # still thinking: never answered
        ("", None, ""),
    ],
)
def test_parse_vote(text: str, decision: int | None, hint: str) -> None:
    assert parse_vote(text) == Vote(decision, hint)


VERDICT = st.sampled_from(["\\boxed{1}", "\\boxed{-1}", "\\boxed{ -1 }", "\\boxed{2}", "\\boxed{}"])
NOISE = st.text(alphabet=st.characters(blacklist_characters="\\[]{}"), max_size=40)
HINT = st.text(alphabet=st.characters(blacklist_characters="\\[]"), max_size=40)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(VERDICT, NOISE, HINT.map(lambda h: f"[HINT_START]{h}[HINT_END]")), max_size=12))
def test_parse_vote_takes_one_decision_and_the_hint_after_it(parts: list[str]) -> None:
    vote = parse_vote("".join(parts))
    verdicts = [int(p.replace(" ", "")[7:-1]) for p in parts if p.startswith("\\boxed") and p.replace(" ", "") in ("\\boxed{1}", "\\boxed{-1}")]
    assert vote.decision == (verdicts[0] if verdicts and len(set(verdicts)) == 1 else None)
    if vote.decision is None:
        assert vote.hint == ""
        return
    first = next(i for i, p in enumerate(parts) if p.startswith("\\boxed") and p.replace(" ", "") in ("\\boxed{1}", "\\boxed{-1}"))
    after = {p[len("[HINT_START]"):-len("[HINT_END]")].strip() for p in parts[first:] if p.startswith("[HINT_START]")}
    assert vote.hint == (after.pop() if len(after) == 1 else "")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=3000))
def test_parse_vote_never_raises(text: str) -> None:
    vote = parse_vote(text)
    # Whatever the text, a decision is only ever read from a verdict that is in it.
    assert vote.decision is None or f"{{{vote.decision}}}" in re.sub(r"\s", "", text)


def votes(*decisions: int | None, hints: tuple[str, ...] = ()) -> list[Vote]:
    hints = hints or tuple("" for _ in decisions)
    return [Vote(d, h) for d, h in zip(decisions, hints)]


@pytest.mark.parametrize(
    ("decisions", "rule", "expected"),
    [((1, 1, -1), "majority", 1), ((1, -1, -1), "majority", -1), ((1, -1, None), "majority", -1), ((1, None, None), "majority", 1),
     ((None, None), "majority", None), ((1, -1, -1), "any", 1), ((1, 1, None), "unanimous", 1), ((1, 1, -1), "unanimous", -1)],
)
def test_decision_rules(decisions: tuple, rule: str, expected: int | None) -> None:
    assert decide(votes(*decisions), rule) == expected


def test_longest_positive_hint_over_the_minimum_wins() -> None:
    ballot = votes(1, 1, -1, 1, hints=("short", "a much longer hint here", "the longest hint of all but negative", "medium hint!"))
    assert choose_hint(ballot, 10, "longest") == "a much longer hint here"
    assert choose_hint(ballot, 10, "first") == "a much longer hint here"
    assert choose_hint(votes(1, hints=("tiny",)), 10, "longest") is None


def test_hint_placement() -> None:
    context = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}, {"role": "tool", "content": "T"}]
    # The reference's header by default; another one is a config value away (env.opd.hint_header).
    assert with_hint(context, "H", "last_user")[1]["content"] == "U\n\n[user's hint / instruction]\nH"
    assert with_hint(context, "H", "system", "[hint]")[0]["content"] == "S\n\n[hint]\nH"
    assert with_hint(context, "H", "new_user")[-1] == {"role": "user", "content": "[user's hint / instruction]\nH"}
    assert context[1]["content"] == "U"  # the original is not modified


def test_turn_pairs_include_tool_call_only_turns_and_join_all_tool_results() -> None:
    messages = [
        {"role": "system", "content": "S"}, {"role": "user", "content": "U"},
        {"role": "assistant", "content": "<tool_call>a</tool_call><tool_call>b</tool_call>"},
        {"role": "tool", "content": "ra"}, {"role": "tool", "content": "rb" * 100},
        {"role": "assistant", "content": "done"},
    ]
    rollout = AgentRollout(Sequence.from_prompt([1, 2]), messages, turns=[TurnSpan(2, 5, 2), TurnSpan(9, 11, 5)])
    pairs = turn_pairs(rollout, max_state_chars=50, max_response_chars=1000)
    assert len(pairs) == 1
    pair = pairs[0]
    assert pair.span == TurnSpan(2, 5, 2) and pair.context == messages[:2] and pair.next_state_role == "tool"
    assert pair.next_state_text.startswith("ra\n---\nrbrb") and "truncated at 50" in pair.next_state_text
    # A long turn: the judge reads its end (the call), or its start with response_cut=head.
    long_turn = "thinking " * 200 + "<tool_call>{}</tool_call>"
    rollout.messages[2] = {"role": "assistant", "content": long_turn}
    (tail,) = turn_pairs(rollout, max_state_chars=50, max_response_chars=100)
    (head,) = turn_pairs(rollout, max_state_chars=50, max_response_chars=100, response_cut="head")
    assert tail.response_text.endswith("<tool_call>{}</tool_call>") and tail.response_text.startswith("[...")
    assert head.response_text.startswith("thinking thinking") and "</tool_call>" not in head.response_text
    # max_response_chars=None: the whole turn, as the reference shows it.
    (whole,) = turn_pairs(rollout, max_state_chars=50, max_response_chars=None)
    assert whole.response_text == long_turn


def distill_group(rows: list[list[int]], lps: list[list[float]]) -> dict:
    return make_group([sequence([5], [6, 7], [-0.2, -0.3])], [0.5], distill_token_ids=[rows], distill_logprobs=[lps])


PAD_IDS, PAD_LPS = [DISTILL_PAD_ID] * 2, [DISTILL_PAD_LOGPROB] * 2


def test_distill_checks() -> None:
    assert check_group(distill_group([PAD_IDS, [6, 1], PAD_IDS], [PAD_LPS, [-0.1, -2.0], PAD_LPS])) == []
    cases = {
        "teacher row on a masked": ([[6, 1], PAD_IDS, PAD_IDS], [[-0.1, -2.0], PAD_LPS, PAD_LPS]),
        "mixes pads": ([PAD_IDS, [6, DISTILL_PAD_ID], PAD_IDS], [PAD_LPS, [-0.1, DISTILL_PAD_LOGPROB], PAD_LPS]),
        "expected K=2": ([PAD_IDS, [6], PAD_IDS], [PAD_LPS, [-0.1], PAD_LPS]),
        "not sorted": ([PAD_IDS, [6, 1], PAD_IDS], [PAD_LPS, [-2.0, -0.1], PAD_LPS]),
        "not finite": ([PAD_IDS, [6, 1], PAD_IDS], [PAD_LPS, [-0.1, float("nan")], PAD_LPS]),
        "one row per token": ([PAD_IDS, [6, 1]], [PAD_LPS, [-0.1, -2.0]]),
    }
    for expected, (rows, lps) in cases.items():
        problems = check_group(distill_group(rows, lps))
        assert any(expected in p for p in problems), (expected, problems)
