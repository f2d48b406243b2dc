"""Ranges declared on the schema's fields, and the one walker that checks a typed config tree.

A field says its range where it is declared (`cpu_s: int = checked(at_least(1))`); checks that
relate several fields are small functions registered with `@relation(Schema)`. `check_tree` walks
the typed tree once, building each key from where its dataclass is mounted, so the same dataclass
mounted at two paths is named at the path the bad value sits at.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from omegaconf import MISSING


class ConfigError(ValueError):
    """A configuration value is out of range or inconsistent; the message names the key."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


def fail(key: str, rule: str, value: Any, hint: str = "") -> None:
    """Raise the one-line ConfigError every check gives: `<key> must be <rule>, got <value>`."""
    raise ConfigError(f"{key} must be {rule}, got {value!r}{hint}", key)


def require(condition: bool, key: str, rule: str, value: Any) -> None:
    """`fail` unless `condition` holds (for the checks that relate several fields)."""
    if not condition:
        fail(key, rule, value)


def join(at: str, name: str) -> str:
    """The key `name` under the node mounted at `at` ("" for the root)."""
    return f"{at}.{name}" if at else name


@dataclass(frozen=True)
class Check:
    """A rule one value must meet: `holds(value)`, and how a message says it."""

    rule: str
    holds: Callable[[Any], bool]
    # (key, value) -> what a refused value is told beyond the rule (a close name, a removed
    # option's fix), "" for nothing.
    advice: Callable[[str, Any], str] = lambda key, value: ""
    # The rule applies to each element of a list (the list's key) or each value of a dict (its own key).
    each: bool = False


def _number(value: float) -> str:
    """A bound as a reader types it: 2**31 rather than 2147483648."""
    if isinstance(value, int) and value >= 2**16 and value & (value - 1) == 0:
        return f"2**{value.bit_length() - 1}"
    return str(value)


def at_least(minimum: float) -> Check:
    return Check(f">= {_number(minimum)}", lambda v: v >= minimum)


def above(minimum: float) -> Check:
    return Check(f"> {_number(minimum)}", lambda v: v > minimum)


def at_most(maximum: float) -> Check:
    return Check(f"<= {_number(maximum)}", lambda v: v <= maximum)


def within(low: float, high: float, ends: str = "[]") -> Check:
    """`low`..`high`, each end closed (`[`, `]`) or open (`(`, `)`), as written in the message."""
    above_low = (lambda v: v >= low) if ends[0] == "[" else (lambda v: v > low)
    below_high = (lambda v: v <= high) if ends[1] == "]" else (lambda v: v < high)
    return Check(f"in {ends[0]}{_number(low)}, {_number(high)}{ends[1]}", lambda v: above_low(v) and below_high(v))


def fraction() -> Check:
    return within(0, 1)


def one_of(*allowed: Any, removed: dict[Any, str] | None = None) -> Check:
    """One of `allowed`; a refused value is told the closest allowed one, or, for an option that
    was removed, why and what to use instead (`removed[value]`)."""
    gone = removed or {}

    def advice(key: str, value: Any) -> str:
        if value in gone:
            return f"; {key}={value} was removed: {gone[value]}"
        close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1, cutoff=0.6)
        return f"; did you mean {close[0]}?" if close else ""

    return Check(f"one of {list(allowed)}", lambda v: v in allowed, advice=advice)


def nonempty(rule: str) -> Check:
    return Check(rule, lambda v: len(v) > 0)


def url(rule: str = "an http(s) URL") -> Check:
    return Check(rule, lambda v: isinstance(v, str) and v.startswith(("http://", "https://")))


def each(check: Check, rule: str | None = None) -> Check:
    """`check` on every element of a list, or every value of a dict (named `key.name`)."""
    return dataclasses.replace(check, rule=rule or check.rule, each=True)


def checked(*checks: Check, null: str | None = None) -> Any:
    """A schema field (no default: the YAML gives every value) whose value must pass `checks`.
    A null value of an Optional field passes; `null` says what null means in the message."""
    return dataclasses.field(default=MISSING, metadata={"checks": checks, "null": null})


# Checks relating several fields of one schema, by the schema they belong to; a schema's own and
# those of its bases run, bases first.
_RELATIONS: dict[type, list[Callable[[Any, str], None]]] = {}


def relation(schema: type) -> Callable[[Callable[[Any, str], None]], Callable[[Any, str], None]]:
    """Register `check(node, at)` for `schema`: it raises a ConfigError naming keys under `at`
    (the path `node` is mounted at) through `require`/`fail`."""

    def register(check: Callable[[Any, str], None]) -> Callable[[Any, str], None]:
        _RELATIONS.setdefault(schema, []).append(check)
        return check

    return register


def check_tree(node: Any, at: str = "") -> None:
    """Check every field of a typed config tree: the nodes under a node first (in field order),
    then its own fields' declared ranges, then its relations; the first problem raises a
    ConfigError naming its full key."""
    if not dataclasses.is_dataclass(node):
        return
    fields = dataclasses.fields(node)
    for field in fields:
        check_tree(getattr(node, field.name), join(at, field.name))
    for field in fields:
        _check_field(field, getattr(node, field.name), join(at, field.name))
    for schema in reversed(type(node).__mro__):
        for check in _RELATIONS.get(schema, ()):
            check(node, at)


def _check_field(field: dataclasses.Field, value: Any, key: str) -> None:
    checks: Iterable[Check] = field.metadata.get("checks", ())
    if value is None:  # OmegaConf lets null only into an Optional field
        return
    for check in checks:
        if not check.each:
            values = [(key, value)]
        elif isinstance(value, dict):
            values = [(join(key, str(name)), item) for name, item in value.items()]
        else:
            values = [(key, item) for item in value]
        for where, item in values:
            if not check.holds(item):
                optional = "Optional" in str(field.type) or "None" in str(field.type)
                null = field.metadata.get("null")
                rule = check.rule + (f" or null ({null})" if null else " or null" if optional else "")
                fail(where, rule, item, check.advice(where, item))
