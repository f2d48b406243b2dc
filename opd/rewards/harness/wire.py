"""The harness's value encoding: plain data as JSON, with tags for what JSON lacks.

Only data crosses between the solution's process and the tests' process: None, bools, ints,
floats (NaN and infinities included), strings, bytes, complex numbers, lists, tuples, dicts,
sets and frozensets, nested up to `MAX_DEPTH`. Integers of any size cross: those past
`PLAIN_INT_BITS` as hexadecimal text (conversion in a power-of-two base is linear and has no
digit limit, unlike JSON's decimal numbers, which CPython caps at 4300 digits; a decimal number
that long in a message is refused). Anything else (a function, an instance of a class the
solution defines, a generator) raises `Unsupported`: the tests then see a TypeError, never an
object whose methods the solution wrote.
"""

from __future__ import annotations

import base64
import json
from typing import Any

MAX_DEPTH = 64
# Longest message, in characters (a bigger one is a protocol error).
MAX_LINE = 32 * 1024 * 1024
# Integers with more bits than this cross as {"$int": hex} instead of JSON numbers.
PLAIN_INT_BITS = 1024


class Unsupported(TypeError):
    """A value that is not plain data."""


def encode(value: Any, depth: int = 0) -> Any:
    if depth > MAX_DEPTH:
        raise Unsupported(f"data nested deeper than {MAX_DEPTH}")
    kind = type(value)
    if kind is int and value.bit_length() > PLAIN_INT_BITS:
        return {"$int": format(value, "x")}
    if value is None or kind in (bool, int, float, str):
        return value
    if kind is list:
        return [encode(v, depth + 1) for v in value]
    if kind is tuple:
        return {"$tuple": [encode(v, depth + 1) for v in value]}
    if kind is dict:
        return {"$dict": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if kind is set:
        return {"$set": [encode(v, depth + 1) for v in value]}
    if kind is frozenset:
        return {"$frozenset": [encode(v, depth + 1) for v in value]}
    if kind is bytes:
        return {"$bytes": base64.b64encode(value).decode("ascii")}
    if kind is complex:
        return {"$complex": [value.real, value.imag]}
    raise Unsupported(f"a {kind.__name__} is not plain data")


def decode(value: Any, depth: int = 0) -> Any:
    if depth > MAX_DEPTH:
        raise ValueError(f"data nested deeper than {MAX_DEPTH}")
    if value is None or type(value) in (bool, int, float, str):
        return value
    if type(value) is list:
        return [decode(v, depth + 1) for v in value]
    if type(value) is not dict or len(value) != 1:
        raise ValueError("malformed value")
    ((tag, body),) = value.items()
    if tag == "$tuple":
        return tuple(decode(v, depth + 1) for v in body)
    if tag == "$dict":
        return {decode(k, depth + 1): decode(v, depth + 1) for k, v in body}
    if tag == "$set":
        return {decode(v, depth + 1) for v in body}
    if tag == "$frozenset":
        return frozenset(decode(v, depth + 1) for v in body)
    if tag == "$bytes":
        return base64.b64decode(body)
    if tag == "$complex":
        return complex(*body)
    if tag == "$int" and type(body) is str:
        return int(body, 16)
    raise ValueError(f"unknown tag {tag!r}")


def dumps(message: dict[str, Any]) -> str:
    return json.dumps(message, allow_nan=True, separators=(",", ":")) + "\n"


def loads(line: str) -> dict[str, Any]:
    if len(line) > MAX_LINE:
        raise ValueError(f"message longer than {MAX_LINE} characters")
    message = json.loads(line)
    if type(message) is not dict:
        raise ValueError("a message must be a JSON object")
    return message
