"""The tool-call parser, `\\boxed{}` extraction, the judge's verdict parser and the calculator never
raise on arbitrary text and stay fast on pathological input (docs/guarantees.md, "Untrusted text")."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st
import pytest

from opd.agent.tool_calls import ToolCallError, parse_tool_call
from opd.distill.judge_prompt import parse_vote, quote_markers, quoted_hints
from opd.rewards.boxed import boxed_contents, final_answer
from opd.tools.calculator import CalculatorError, evaluate

# The leftover check (hostile/conftest.py) scans the whole machine: these tests run on one xdist worker.
pytestmark = pytest.mark.xdist_group("hostile")



def _fixture_turn_parser():
    from transformers import AutoTokenizer

    from opd.agent.chat_format import ChatFormat, TurnParser
    from opd.fixture.build import ensure_fixture
    from opd.tools import math_tools
    from opd.tools.registry import schemas

    return TurnParser(ChatFormat(), AutoTokenizer.from_pretrained(str(ensure_fixture())), schemas(math_tools.TOOLS))


def _turn(text: str) -> object:
    """vLLM's Hermes parser as the envs use it: a whole turn, and a segment's calls."""
    global _TURN_PARSER
    if _TURN_PARSER is None:
        _TURN_PARSER = _fixture_turn_parser()
    return _TURN_PARSER.parse(text), _TURN_PARSER.calls(text)


_TURN_PARSER = None
PARSERS = {
    "tool_call": (parse_tool_call, ToolCallError),
    "vllm_turn_parser": (_turn, ()),
    "judge_vote": (parse_vote, ()),
    "judge_quoting": (quote_markers, ()),
    "planted_hints": (quoted_hints, ()),
    "boxed": (boxed_contents, ()),
    "final_answer": (final_answer, ()),
    "calculator": (evaluate, CalculatorError),
}
PATHOLOGICAL = {
    "deep_json": '{"name": "calculator", "arguments": ' + "[" * 200_000 + "]" * 200_000 + "}",
    "open_braces": "{" * 100_000,
    "nested_boxes": "\\boxed{" * 50_000,
    "deep_parens": "(" * 100_000 + "1" + ")" * 100_000,
    "power_tower": "9**9**9**9**9",
    "unary_chain": "-" * 100_000 + "1",
    "huge_box": "</think>\\boxed{" + "a" * 1_000_000 + "}",
    "many_tool_tags": "<tool_call>" * 100_000,
    "many_verdicts": "\\boxed{1}" * 100_000,
    "many_open_hints": "\\boxed{1}" + "[HINT_START]" * 100_000,
    "many_hints": "\\boxed{1}" + "[HINT_START]a[HINT_END]" * 50_000,
    "open_thinking": "<think>" * 100_000 + "</think>" * 3,
    "spaced_tag": "<" + " " * 200_000 + "/" + " " * 200_000,
    "invisible_run": "[" + "\u200b" * 200_000 + "\\" + "\u200b" * 200_000,
    "look_alike_hints": "\\𝐛𝐨𝐱𝐞𝐝{1}" + "［ＨＩＮＴ＿ＳＴＡＲＴ］a［ＨＩＮＴ＿ＥＮＤ］" * 30_000,
    "heading_run": "#" * 500_000 + " Next state",
    "fence_run": "=" * 500_000 + " END QUOTE",
    "spaced_letters": "\\ b o x e " * 100_000,
    "role_labels": "role: " * 100_000,
    "rare_characters": "".join(map(chr, range(0x10000, 0x40000, 3))),
}


@pytest.mark.parametrize("text_name", sorted(PATHOLOGICAL))
@pytest.mark.parametrize("parser_name", sorted(PARSERS))
def test_parsers_survive_pathological_text_quickly(parser_name: str, text_name: str) -> None:
    parse, allowed = PARSERS[parser_name]
    try:
        parse("1")  # warm up: builds the vLLM parser once, outside the clock
    except allowed:
        pass
    started = time.thread_time()  # CPU time: what the parser computed, not the machine's load
    try:
        parse(PATHOLOGICAL[text_name])
    except allowed:  # the documented, clean refusal
        pass
    # A quadratic path over these 0.4-1.2 M characters takes minutes; a linear one well under a second.
    # CPU time still grows on a loaded machine (0.77 s seen once for 0.5 s), so the bound has room.
    assert time.thread_time() - started < 2.0


ADVERSARIAL = st.lists(st.sampled_from(["{", "}", "[", "]", '"', "\\", "\\boxed", "<tool_call>", "</tool_call>", "</think>", "**", "(", ")", "9", ":", ",", "name", "arguments", "\n", "\\boxed{1}", "\\boxed{-1}"]), max_size=3000).map("".join)


@settings(max_examples=150, deadline=None)
@given(ADVERSARIAL)
def test_parsers_never_raise_on_adversarial_token_soup(text: str) -> None:
    for parse, allowed in PARSERS.values():
        try:
            parse(text)
        except allowed:
            pass
