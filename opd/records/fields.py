"""The type of every field of a group besides the numeric arrays, as data, and one checker.

A group is read by more than its writer: the viewer, the trainer, `python -m opd.records check`.
Each field the format names (docs/records.md, "Record format") has a type here; a value of another type
makes the group invalid, with a sentence naming the field's path and what it must be. Keys the
format does not name are allowed (records written by other Atropos environments carry their own);
what they hold is only ever shown as escaped text.

A type is a small value: a Python type, a tuple of alternatives, `ListOf`, `DictOf`, `Record`,
`Literal` or a predicate (`Check`).
"""

from __future__ import annotations

import math
import reprlib
import sys
from dataclasses import dataclass
from typing import Any, Callable, Union


@dataclass(frozen=True)
class ListOf:
    item: Any


@dataclass(frozen=True)
class DictOf:
    """A JSON object with string keys, every value of type `value`."""

    value: Any


@dataclass(frozen=True)
class Record:
    """A JSON object: the named fields (all optional) have their types; other keys are allowed."""

    fields: dict[str, Any]


@dataclass(frozen=True)
class Literal:
    values: tuple[Any, ...]


@dataclass(frozen=True)
class Check:
    """A predicate, and what the value must be, in words."""

    test: Callable[[Any], bool]
    words: str


Type = Union[type, tuple, ListOf, DictOf, Record, Literal, Check, None]

FLOAT64_MAX = sys.float_info.max


def is_finite_number(value: Any) -> bool:
    """An int or a float that is finite as a float64: an integer such as 10**400 is not (JSON
    allows it; `float()` of it raises, and `math.isfinite` too)."""
    if type(value) is float:
        return math.isfinite(value)
    return type(value) is int and -FLOAT64_MAX <= value <= FLOAT64_MAX


INT = Check(lambda v: type(v) is int, "an integer")
COUNT = Check(lambda v: type(v) is int and v >= 0, "a non-negative integer")
# What a 64-bit integer column holds (the export's `weight_version`, a trainer's step counter).
COUNT64 = Check(lambda v: type(v) is int and 0 <= v < 2**63, "a non-negative integer below 2**63")
NUMBER = Check(is_finite_number, "a finite number")
# A log probability: finite and at most 0.
LOGPROB = Check(lambda v: is_finite_number(v) and v <= 0, "a finite number <= 0")
STR = Check(lambda v: type(v) is str, "a string")
BOOL = Check(lambda v: type(v) is bool, "true or false")
NULL = Check(lambda v: v is None, "null")
SCALAR = (NUMBER, STR, BOOL, NULL)
SPAN = Check(lambda v: type(v) is list and len(v) == 2 and all(type(x) is int and x >= 0 for x in v) and v[0] <= v[1],
             "[start, end] integers with 0 <= start <= end")
VOTE = Literal((1, -1, None))

# One judged turn of opd_coding (`overrides[i].opd_turns[j]`).
OPD_TURN = Record({
    "span": SPAN, "message_index": (COUNT, NULL), "next_state_role": STR, "votes": ListOf(VOTE), "votes_failed": COUNT,
    "votes_cut_off": COUNT, "hints_planted": COUNT, "decision": VOTE, "hint": (STR, NULL), "scored": BOOL, "error": (STR, NULL),
})
# One sequence's details (`overrides[i]`): what both environments and the OPD stage write.
DETAIL = Record({
    "reward_signals": DictOf(NUMBER), "tool_errors": COUNT, "finish": STR, "generated_tokens": COUNT,
    "passed": BOOL, "correct": BOOL, "tool_calls": COUNT, "verify_timed_out": BOOL,
    "tests": STR, "turns": COUNT, "tools_used": ListOf(STR),
    "teacher_logprobs": ListOf((LOGPROB, NULL)), "opd_turns": ListOf(OPD_TURN),
})
MESSAGE = Record({"role": STR, "content": (STR, NULL, ListOf(Check(lambda v: type(v) is dict, "an object")))})
# The group's optional fields besides the numeric arrays (`opd.records.rules` checks those).
GROUP = Record({
    "overrides": (NULL, ListOf(DETAIL)),
    # `teacher`: the teacher kind that scored every sampled token (its rows: a value rule), `teacher_model` its model.
    "group_overrides": (NULL, Record({"env": STR, "item_id": (STR, INT), "answer": (STR, NUMBER), "weight_version": COUNT64, "opd_wall_s": NUMBER,
                                      "teacher": (STR, NULL), "teacher_model": STR})),
    "generation_params": (NULL, DictOf((*SCALAR, ListOf(SCALAR)))),
    "messages": (NULL, ListOf((NULL, ListOf(MESSAGE)))),
    "advantages": (NULL, ListOf((NULL, ListOf(NUMBER)))),
    "ref_logprobs": (NULL, ListOf((NULL, ListOf(NUMBER)))),
})


def _is_literal(value: Any, kind: Literal) -> bool:
    # `True == 1` in Python: compare types too.
    return any(value is v if v is None or isinstance(v, bool) else type(value) is type(v) and value == v for v in kind.values)


def fits(value: Any, kind: Type) -> bool:
    """Whether `value` has type `kind`: `problem(...) is None`, without building the sentences of
    the alternatives it does not take (a valid group's check writes none)."""
    if isinstance(kind, Check):
        return bool(kind.test(value))
    if isinstance(kind, Literal):
        return _is_literal(value, kind)
    if isinstance(kind, tuple):
        return any(fits(value, option) for option in kind)
    if isinstance(kind, ListOf):
        return type(value) is list and all(fits(item, kind.item) for item in value)
    if isinstance(kind, (DictOf, Record)):
        if type(value) is not dict:
            return False
        for key, item in value.items():
            if type(key) is not str:
                return False
            item_kind = kind.value if isinstance(kind, DictOf) else kind.fields.get(key, _ANY)
            if item_kind is not _ANY and not fits(item, item_kind):
                return False
        return True
    raise TypeError(f"not a field type: {kind!r}")


def problem(value: Any, kind: Type, where: str) -> str | None:
    """None when `value` has type `kind`, else a sentence naming the first place it has not."""
    if isinstance(kind, Check):
        return None if kind.test(value) else f"{where} must be {kind.words} (got {_shown(value)})"
    if isinstance(kind, Literal):
        ok = _is_literal(value, kind)
        return None if ok else f"{where} must be one of {', '.join('null' if v is None else str(v) for v in kind.values)} (got {_shown(value)})"
    if isinstance(kind, tuple):
        if any(fits(value, option) for option in kind):
            return None
        found = [problem(value, option, where) for option in kind]
        if all(found):
            # The alternative of the value's own JSON kind says most (a list's bad item, not "must be null").
            same = [p for option, p in zip(kind, found) if _container(option) is not None and _container(option) is type(value)]
            return same[0] if same else f"{where} must be {' or '.join(_words(option) for option in kind)} (got {_shown(value)})"
        return None
    if isinstance(kind, ListOf):
        if type(value) is not list:
            return f"{where} must be a list (got {_shown(value)})"
        for index, item in enumerate(value):
            if found := problem(item, kind.item, f"{where}[{index}]"):
                return found
        return None
    if isinstance(kind, (DictOf, Record)):
        if type(value) is not dict:
            return f"{where} must be an object (got {_shown(value)})"
        for key, item in value.items():
            if type(key) is not str:
                return f"{where} has a key that is not a string"
            item_kind = kind.value if isinstance(kind, DictOf) else kind.fields.get(key, _ANY)
            if item_kind is not _ANY and (found := problem(item, item_kind, f"{where}.{key}")):
                return found
        return None
    raise TypeError(f"not a field type: {kind!r}")


_ANY = object()


def _container(kind: Type) -> type | None:
    return list if isinstance(kind, ListOf) else dict if isinstance(kind, (DictOf, Record)) else None


def _words(kind: Type) -> str:
    if isinstance(kind, Check):
        return kind.words
    if isinstance(kind, Literal):
        return "one of " + ", ".join("null" if v is None else str(v) for v in kind.values)
    if isinstance(kind, tuple):
        return " or ".join(_words(k) for k in kind)
    return "a list" if isinstance(kind, ListOf) else "an object"


_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 60


def _shown(value: Any) -> str:
    """A short repr, built without walking a large value whole."""
    return _SHOWN.repr(value)
