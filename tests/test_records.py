"""Record checks and the flushed JSONL writer."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import make_group, sequence
from opd.records import DISTILL_PAD_ID, DISTILL_PAD_LOGPROB, MASK, MASKED_LOGPROB, RULES, GroupWriter, check_group, is_valid, read_groups


def good_group() -> dict:
    return make_group(
        [sequence([1, 2], [3, 4], [-0.1, -2.0]), sequence([1, 2], [5], -0.5)], [1.0, -1.0],
        overrides=[{"reward_signals": {"correct": 1.0}, "correct": True, "tool_calls": 1, "tool_errors": 0, "finish": "eos", "generated_tokens": 2},
                   {"reward_signals": {"correct": 0.0}, "correct": False, "tool_calls": 0, "tool_errors": 0, "finish": "eos", "generated_tokens": 1}],
        group_overrides={"item_id": "m-1", "answer": "4", "weight_version": 0},
        generation_params={"temperature": 1.0, "top_p": 1.0},
        messages=None, advantages=None, ref_logprobs=None,
    )


def test_good_group_has_no_problems() -> None:
    assert check_group(good_group()) == []


def test_each_misalignment_is_reported() -> None:
    cases = {
        "masks[1] has 2 entries": lambda g: g["masks"][1].pop(),
        "inference_logprobs[0] has 3 entries": lambda g: g["inference_logprobs"][0].pop(),
        "scores must have one entry per sequence": lambda g: g["scores"].pop(),
        "is neither -100 nor the token id": lambda g: g["masks"][0].__setitem__(2, 7),
        "on a generated token": lambda g: g["inference_logprobs"][0].__setitem__(3, 0.5),
        "on a masked position": lambda g: g["inference_logprobs"][0].__setitem__(0, -0.3),
        "not a finite number": lambda g: g["scores"].__setitem__(0, float("nan")),
        "masks every position": lambda g: g["masks"].__setitem__(1, [MASK, MASK, MASK]),
    }
    for expected, breaks in cases.items():
        group = good_group()
        breaks(group)
        problems = check_group(group)
        assert any(expected in p for p in problems), (expected, problems)


def test_a_sequence_longer_than_the_runs_context_is_refused() -> None:
    """The group says the run's context (`generation_params.max_model_len`); no sequence passes it."""
    group = good_group()
    group["generation_params"]["max_model_len"] = 4
    assert check_group(group) == [] and is_valid(group)
    group["generation_params"]["max_model_len"] = 3
    assert check_group(group) == ["tokens[0] has 4 tokens, more than the run's context (generation_params.max_model_len=3)"]
    assert not is_valid(group) and not reference_valid(group)
    for bad in (0, -1, 2.5, "4096", True):
        group["generation_params"]["max_model_len"] = bad
        assert any("max_model_len must be a positive int" in p for p in check_group(group)), bad


def test_writer_flushes_each_group_and_handles_numpy(tmp_path) -> None:
    path = tmp_path / "groups.jsonl"
    writer = GroupWriter(path)
    group = good_group()
    group["scores"] = np.array([1.0, -1.0])
    writer.write(group)
    # Readable before close: a killed process loses nothing already written.
    assert json.loads(path.read_text().splitlines()[0])["scores"] == [1.0, -1.0]
    writer.write(good_group())
    writer.close()
    assert len(list(read_groups(path))) == 2


def test_check_cli_reports_bad_files(tmp_path) -> None:
    from opd.records.__main__ import main

    path = tmp_path / "g.jsonl"
    path.write_text(json.dumps(good_group()) + "\n")
    assert main(["check", str(path)]) == 0
    bad = good_group()
    bad["masks"][0].pop()
    path.write_text(json.dumps(good_group()) + "\n" + json.dumps(bad) + "\n" + '{"tokens": [[1,')
    assert main(["check", str(path)]) == 1


def test_gzip_records_read_back_and_validate_even_without_their_trailer(tmp_path) -> None:
    import shutil

    from opd.records.__main__ import check_file as validate_file

    plain, packed = tmp_path / "g.jsonl", tmp_path / "g.jsonl.gz"
    groups = [good_group() for _ in range(3)]
    for number, group in enumerate(groups):  # three groups, not one group three times (a duplicate)
        group["group_overrides"]["item_id"] = f"m-{number}"
    with GroupWriter(plain) as a, GroupWriter(packed) as b:
        for group in groups:
            a.write(group)
            b.write(group)
        # What a SIGKILL leaves: the file as flushed so far, no gzip trailer.
        shutil.copy(packed, tmp_path / "killed.jsonl.gz")
    assert list(read_groups(packed)) == list(read_groups(plain)) == groups
    assert list(read_groups(tmp_path / "killed.jsonl.gz")) == groups
    assert validate_file(packed) == (3, []) and validate_file(tmp_path / "killed.jsonl.gz") == (3, [])
    with GroupWriter(packed) as again:  # appending adds a gzip member
        again.write(groups[0])
    assert len(list(read_groups(packed))) == 4


# ---- one list of rules: the fast check and the thorough one agree --------------------------


def distill_group() -> dict:
    """A valid OPD group: teacher rows on the generated tokens of sequence 0, pads elsewhere."""
    group = good_group()
    k = 3
    pad_ids, pad_lps = [DISTILL_PAD_ID] * k, [DISTILL_PAD_LOGPROB] * k
    group["distill_token_ids"] = [[pad_ids, pad_ids, [3, 9, 1], [4, 2, 8]], [pad_ids, pad_ids, pad_ids]]
    group["distill_logprobs"] = [[pad_lps, pad_lps, [-0.1, -1.0, -3.0], [-0.5, -0.6, -2.0]], [pad_lps, pad_lps, pad_lps]]
    group["messages"] = [[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]] * 2
    turn = {"span": [2, 4], "message_index": 1, "next_state_role": "tool", "votes": [1, -1, None], "votes_failed": 0, "votes_cut_off": 1,
            "hints_planted": 0, "decision": 1, "hint": "h", "scored": True, "error": None}
    group["overrides"] = [{"reward_signals": {"correctness": 1.0}, "tests": "pass", "turns": 1, "tools_used": ["terminal"], "tool_errors": 0,
                           "finish": "answer", "generated_tokens": 2, "opd_turns": [turn], "teacher_logprobs": [None, None, -0.1, -0.5]},
                          {"reward_signals": {"correctness": 0.0}, "tests": "fail", "turns": 1, "tools_used": [], "tool_errors": 1,
                           "finish": "answer", "generated_tokens": 1, "opd_turns": [], "teacher_logprobs": [None, None, None]}]
    return group


def test_every_rule_is_named_and_the_distill_group_is_valid() -> None:
    names = [rule.name for rule in RULES.values()]
    assert names == RULES.names and {rule.layer for rule in RULES.values()} == {"group", "field", "shape", "value"}
    assert check_group(distill_group()) == [] and is_valid(distill_group())


_VALUES = st.sampled_from([0, -1, 1, 7, -100, 0.5, -0.5, 1.0, -1e9, float("nan"), float("inf"), True, None, "x", [], [1], [[1]]])


def _paths(tree, prefix=()):
    """Every (path, value) in a JSON-like tree."""
    yield prefix, tree
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(tree, list):
        for index, value in enumerate(tree):
            yield from _paths(value, prefix + (index,))


@st.composite
def mutated_groups(draw) -> dict:
    """A valid group (plain or OPD) with 1-3 random edits: a value replaced, an entry dropped or
    repeated, a key removed."""
    group = draw(st.sampled_from([good_group, distill_group]))()
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p, _ in _paths(group) if p]
        path = draw(st.sampled_from(paths))
        parent = group
        for key in path[:-1]:
            parent = parent[key]
        key, kind = path[-1], draw(st.sampled_from(["replace", "drop", "repeat"]))
        if kind == "replace":
            parent[key] = copy.deepcopy(draw(_VALUES))
        elif kind == "drop":
            del parent[key]
        elif isinstance(parent, list):
            parent.insert(key, copy.deepcopy(parent[key]))
    return group


def _number(x) -> bool:
    return type(x) in (int, float)


def _count(x) -> bool:
    return type(x) is int and x >= 0


_TURN_TYPES = {
    "span": lambda v: type(v) is list and len(v) == 2 and all(_count(x) for x in v) and v[0] <= v[1],
    "message_index": lambda v: v is None or _count(v), "next_state_role": lambda v: type(v) is str,
    "votes": lambda v: type(v) is list and all(x is None or (type(x) is int and x in (1, -1)) for x in v),
    "votes_failed": _count, "votes_cut_off": _count, "hints_planted": _count,
    "decision": lambda v: v is None or (type(v) is int and v in (1, -1)), "hint": lambda v: v is None or type(v) is str,
    "scored": lambda v: type(v) is bool, "error": lambda v: v is None or type(v) is str,
}
_DETAIL_TYPES = {
    "reward_signals": lambda v: type(v) is dict and all(type(k) is str and _number(x) and math.isfinite(x) for k, x in v.items()),
    "tool_errors": _count, "generated_tokens": _count, "tool_calls": _count, "turns": _count, "finish": lambda v: type(v) is str,
    "tests": lambda v: type(v) is str, "correct": lambda v: type(v) is bool, "verify_timed_out": lambda v: type(v) is bool,
    "tools_used": lambda v: type(v) is list and all(type(x) is str for x in v),
    "teacher_logprobs": lambda v: type(v) is list and all(x is None or (_number(x) and math.isfinite(x) and x <= 0) for x in v),
    "opd_turns": lambda v: type(v) is list and all(type(t) is dict and all(type(k) is str for k in t)
                                                   and all(_TURN_TYPES.get(k, lambda _: True)(x) for k, x in t.items()) for t in v),
}


def reference_fields_valid(group) -> bool:
    """The field rules written out plainly: the types of the fields the format names, and their lengths."""
    n, lengths = len(group["tokens"]), [len(t) if isinstance(t, list) else 0 for t in group["tokens"]]
    details = group.get("overrides")
    if details is not None:
        if type(details) is not list or len(details) != n:
            return False
        for detail, length in zip(details, lengths):
            if type(detail) is not dict or not all(type(k) is str for k in detail):
                return False
            if not all(_DETAIL_TYPES.get(k, lambda _: True)(v) for k, v in detail.items()):
                return False
            if "teacher_logprobs" in detail and len(detail["teacher_logprobs"]) != length:
                return False
            if any("span" in t and t["span"][1] > length for t in detail.get("opd_turns", [])):
                return False
    extra = group.get("group_overrides")
    if extra is not None:
        if type(extra) is not dict or not all(type(k) is str for k in extra):
            return False
        checks = {"item_id": lambda v: type(v) in (str, int), "answer": lambda v: type(v) is str or (_number(v) and math.isfinite(v)),
                  "weight_version": lambda v: _count(v) and v < 2**63, "opd_wall_s": lambda v: _number(v) and math.isfinite(v)}
        if not all(checks.get(k, lambda _: True)(v) for k, v in extra.items()):
            return False
    scalar = lambda v: v is None or type(v) in (str, bool) or (_number(v) and math.isfinite(v))  # noqa: E731
    params = group.get("generation_params")
    if params is not None and (type(params) is not dict or not all(type(k) is str and (scalar(v) or (type(v) is list and all(map(scalar, v))))
                                                                   for k, v in params.items())):
        return False
    messages = group.get("messages")
    if messages is not None:
        if type(messages) is not list or len(messages) != n:
            return False
        for chat in messages:
            if chat is not None and (type(chat) is not list or not all(
                    type(m) is dict and all(type(k) is str for k in m) and type(m.get("role", "")) is str
                    and (m.get("content") is None or type(m.get("content")) is str
                         or (type(m["content"]) is list and all(type(x) is dict for x in m["content"]))) for m in chat)):
                return False
    for key in ("advantages", "ref_logprobs"):
        rows = group.get(key)
        if rows is not None:
            if type(rows) is not list or len(rows) != n:
                return False
            for row, length in zip(rows, lengths):
                if row is not None and (type(row) is not list or len(row) != length or not all(_number(x) and math.isfinite(x) for x in row)):
                    return False
    return True


def reference_valid(group) -> bool:
    """The record rules written out plainly, position by position (an oracle for the tests)."""
    if not isinstance(group, dict) or not isinstance(group.get("tokens"), list) or not group["tokens"]:
        return False
    n = len(group["tokens"])
    lps, ids, tlps = group.get("inference_logprobs"), group.get("distill_token_ids"), group.get("distill_logprobs")
    for key, value in (("masks", group.get("masks")), ("scores", group.get("scores"))):
        if not isinstance(value, list) or len(value) != n:
            return False
    if lps is not None and (not isinstance(lps, list) or len(lps) != n):
        return False
    distill = ids is not None or tlps is not None
    if distill and not (isinstance(ids, list) and isinstance(tlps, list) and len(ids) == len(tlps) == n):
        return False
    if not reference_fields_valid(group):
        return False
    params = group.get("generation_params")
    limit = params.get("max_model_len") if isinstance(params, dict) else None
    if limit is not None and (type(limit) is not int or limit < 1 or any(isinstance(t, list) and len(t) > limit for t in group["tokens"])):
        return False
    ks = set()
    for i in range(n):
        tokens, masks, score = group["tokens"][i], group["masks"][i], group["scores"][i]
        if not _number(score) or not math.isfinite(score):
            return False
        if not isinstance(tokens, list) or not tokens or not all(type(t) is int and t >= 0 for t in tokens):
            return False
        if not isinstance(masks, list) or len(masks) != len(tokens) or not all(type(m) is int for m in masks):
            return False
        if any(m != MASK and m != t for m, t in zip(masks, tokens)) or all(m == MASK for m in masks):
            return False
        if lps is not None:
            row = lps[i]
            if not isinstance(row, list) or len(row) != len(tokens) or not all(_number(v) and math.isfinite(v) for v in row):
                return False
            if any((m != MASK and v > 0) or (m == MASK and v != MASKED_LOGPROB) for m, v in zip(masks, row)):
                return False
        if distill:
            rows, row_lps = ids[i], tlps[i]
            if not isinstance(rows, list) or not isinstance(row_lps, list) or len(rows) != len(tokens) or len(row_lps) != len(tokens):
                return False
            for r, l, m in zip(rows, row_lps, masks):
                if not isinstance(r, list) or not isinstance(l, list) or not r or len(r) != len(l) or not all(type(x) is int for x in r) or not all(_number(x) for x in l):
                    return False
                ks.add(len(r))
                pads = [x == DISTILL_PAD_ID for x in r]
                if all(pads):
                    if any(x != DISTILL_PAD_LOGPROB for x in l):
                        return False
                    continue
                if any(pads) or m == MASK or any(x < 0 for x in r) or not all(math.isfinite(x) and x <= 0 for x in l):
                    return False
                if any(a < b for a, b in zip(l, l[1:])):
                    return False
    return len(ks) <= 1


@settings(max_examples=400, deadline=None)
@given(mutated_groups())
def test_the_fast_and_the_thorough_check_agree_on_mutated_groups(group: dict) -> None:
    problems = check_group(group)
    assert is_valid(group) == (problems == [])
    assert all(isinstance(p, str) and p for p in problems)
    # And both agree with the rules written out plainly.
    assert is_valid(group) == reference_valid(group), problems


def test_each_kind_of_break_is_named_by_its_rule() -> None:
    cases = {
        "mask_is_token_or_mask": lambda g: g["masks"][0].__setitem__(2, 7),
        "teacher_rows_are_sorted": lambda g: g["distill_logprobs"][0].__setitem__(2, [-3.0, -1.0, -0.1]),
        "teacher_rows_sit_on_generated_tokens": lambda g: (g["distill_token_ids"][0].__setitem__(0, [1, 2, 3]), g["distill_logprobs"][0].__setitem__(0, [-0.1, -0.2, -0.3])),
        "pads_fill_whole_rows": lambda g: g["distill_token_ids"][0].__setitem__(2, [3, DISTILL_PAD_ID, 1]),
        "distill_k_is_the_same_everywhere": lambda g: g["distill_token_ids"][1].__setitem__(0, [DISTILL_PAD_ID] * 2),
        "score_is_finite": lambda g: g["scores"].__setitem__(1, math.inf),
    }
    by_name = {rule.name: rule for rule in RULES.values()}
    for name, breaks in cases.items():
        group = distill_group()
        breaks(group)
        assert not is_valid(group), name
        assert name in by_name


def _encoded(encode, group):
    try:
        return "value", json.loads(encode(group))
    except (ValueError, TypeError, UnicodeEncodeError) as err:
        return "error", type(err).__name__


@settings(max_examples=400, deadline=None)
@given(mutated_groups())
def test_the_writers_line_holds_what_json_would_write(group: dict) -> None:
    """The per-token arrays go through msgspec: the same values back, and what json refuses
    (a NaN, an infinity) is refused too, never written as null."""
    from opd.records.io import group_line

    by_json = _encoded(lambda g: json.dumps(g, ensure_ascii=False, allow_nan=False), group)
    assert _encoded(group_line, group) == by_json


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_the_writer_refuses_a_non_finite_logprob_as_json_does(tmp_path, bad: float) -> None:
    group = good_group()
    group["inference_logprobs"][0][-1] = bad
    group["tokens"] = [np.array(t) for t in group["tokens"]]  # numpy rows are plain lists in the file
    with GroupWriter(tmp_path / "g.jsonl") as writer, pytest.raises(ValueError, match="not JSON compliant"):
        writer.write(group)
    good = good_group()
    good["tokens"] = [np.array(t) for t in good["tokens"]]
    with GroupWriter(tmp_path / "h.jsonl") as writer:
        writer.write(good)
    assert next(read_groups(tmp_path / "h.jsonl")) == good_group()
