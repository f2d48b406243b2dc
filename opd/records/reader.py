"""Reading record files with bounds: the one reader of `python -m opd.records check`, the viewer and
`resume=true`, so that all three take and refuse the same lines.

A record file may come from anywhere. The reader streams it (plain or gzip, also multi-member and
unterminated gzip as a killed writer leaves it) and never holds more than one line:
- decompression is capped: in bytes inflated (`max_inflated_bytes`) and in ratio (`max_ratio`,
  of everything inflated so far, checked every MiB; records inflate 3-120 times, a bomb of zeros
  or newlines 229-1,028 times), so a bomb is refused after its first MiB;
- a line is capped in bytes (`max_line_bytes`): a longer one ends the reading there;
- a line is UTF-8 JSON with no key twice in one object, nested at most `max_depth` deep and with
  no number of more than `max_digits` digits (Python's own bound, whatever the interpreter's
  setting; a larger number takes quadratic time to read).
A problem is one line naming the file and the line number; text from the file in it is escaped
(`opd.records.escape.console`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterator, NamedTuple

import msgspec
import numpy as np

from opd.records.escape import console
from opd.run_files import open_file

# Bytes read from the file (compressed or not) per call.
_CHUNK = 1 << 20
# Bytes inflated per call: a bomb never gets more than this past the checks at once.
_INFLATE_CHUNK = 1 << 20
# The compression ratio (of all inflated so far) is checked each time this many more bytes are inflated.
RATIO_EVERY = 1 << 20


@dataclass(frozen=True)
class Limits:
    """What the reader takes (the same for check, view and resume)."""

    # The longest line, in bytes (a group of 16 rollouts of 32,768 tokens with K=20 teacher rows
    # on every token is ~600 MB): a longer one ends the reading. The writer refuses to write one.
    max_line_bytes: int = 1 << 30
    # Nesting of arrays and objects (a record nests 7 deep; the viewer and the checks recurse).
    max_depth: int = 64
    # Digits of one number (Python's default `int` bound, held whatever the interpreter's setting).
    max_digits: int = 4300
    # Bytes a gzip file may inflate to, in all.
    max_inflated_bytes: int = 1 << 40
    # Inflated / compressed bytes of all read so far, checked every RATIO_EVERY inflated: records
    # inflate 3-35 times, and a group of teacher pads only (K=100) 120 times; deflate at most
    # 1,032 times (zeros or newlines: 229 at gzip's level 1, 1,028 from level 4).
    max_ratio: float = 200.0


LIMITS = Limits()


class RecordFileError(ValueError):
    """A record file the reader refuses, from a given line on: one line, `file:line: why`.
    `fatal`: nothing after it can be read (a line past the cap, a decompression bomb)."""

    def __init__(self, message: str, fatal: bool = False) -> None:
        super().__init__(message)
        self.fatal = fatal


@dataclass
class Record:
    """One line of a record file: where it is, and its value or what is wrong with it. `start` and
    `end` (after its newline) are offsets in the file's (inflated) bytes; `terminated`: it ends
    with a newline (a killed writer leaves at most one last line without)."""

    number: int
    start: int
    end: int
    terminated: bool
    value: Any = None
    problem: str | None = None
    # A problem after which nothing more is read (a line past the cap, a decompression bomb).
    fatal: bool = False

    @property
    def blank(self) -> bool:
        return self.problem is None and self.value is None


class _Stop(Exception):
    """The stream cannot be read further: why."""


def _inflated(handle: IO[bytes], limits: Limits) -> Iterator[bytes]:
    """The inflated bytes of a gzip stream, member after member; everything a killed writer had
    flushed, also without a trailer. Raises _Stop past a cap or on bytes that are not gzip."""
    inflater = zlib.decompressobj(wbits=31)
    total = consumed = 0
    next_check = RATIO_EVERY
    while chunk := handle.read(_CHUNK):
        data = chunk
        while data:
            try:
                out = inflater.decompress(data, _INFLATE_CHUNK)
            except zlib.error as err:
                raise _Stop(f"not gzip data after {total} inflated bytes ({err})") from None
            if inflater.eof:
                rest = inflater.unused_data
                inflater = zlib.decompressobj(wbits=31)
            else:
                rest = inflater.unconsumed_tail
            consumed += len(data) - len(rest)
            total += len(out)
            data = rest
            if total > limits.max_inflated_bytes:
                raise _Stop(f"inflates past {limits.max_inflated_bytes} bytes (the reader's cap)")
            if total >= next_check:
                next_check = total + RATIO_EVERY
                if total > limits.max_ratio * consumed:
                    raise _Stop(f"inflates {total / consumed:.0f} times its size (at most {limits.max_ratio:g}: a decompression bomb?); "
                                f"read stopped after {total} bytes")
            if out:
                yield out


def _plain(handle: IO[bytes]) -> Iterator[bytes]:
    while chunk := handle.read(_CHUNK):
        yield chunk


# Lines of JSON whitespace only, one after another (counted at once: a file of nothing but
# newlines is read as fast as it inflates).
_BLANK_RUN = re.compile(rb"(?:[ \t\r\x0b\x0c]*\n)+")


class _Line(NamedTuple):
    offset: int
    end: int  # after the newline
    raw: bytes | None  # None: `blank` blank lines
    terminated: bool
    blank: int = 0


def _lines(chunks: Iterator[bytes], limits: Limits) -> Iterator[_Line]:
    """Each line of `chunks` without its newline (runs of blank lines as one item); _Stop at a
    line longer than the cap, before it is held whole."""
    pending: list[bytes] = []
    held = 0
    offset = 0
    for chunk in chunks:
        start = 0
        while True:
            if not pending and (run := _BLANK_RUN.match(chunk, start)):
                yield _Line(offset, offset + run.end() - start, None, True, chunk.count(b"\n", start, run.end()))
                offset += run.end() - start
                start = run.end()
            newline = chunk.find(b"\n", start)
            if newline < 0:
                break
            if held + newline - start > limits.max_line_bytes:
                raise _Stop(f"a line longer than {limits.max_line_bytes} bytes (the reader's cap)")
            line = b"".join([*pending, chunk[start:newline]]) if pending else chunk[start:newline]
            yield _Line(offset, offset + len(line) + 1, line, True)
            offset += len(line) + 1
            pending, held, start = [], 0, newline + 1
        if start < len(chunk):
            held += len(chunk) - start
            if held > limits.max_line_bytes:
                raise _Stop(f"a line longer than {limits.max_line_bytes} bytes (the reader's cap)")
            pending.append(chunk[start:])
    if pending:
        line = b"".join(pending)
        yield _Line(offset, offset + len(line), line, False)


# A JSON string (with its escapes); what is left without them is numbers, literals and punctuation.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def _structure(raw: bytes) -> bytes:
    return _STRING.sub(b'""', raw) if b'"' in raw else raw


def nesting(raw: bytes) -> int:
    """How deep the arrays and objects of the JSON text `raw` nest (strings do not count)."""
    brackets = _structure(raw).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    codes = np.frombuffer(brackets, dtype=np.uint8)
    return int(np.cumsum(np.where((codes == 0x5B) | (codes == 0x7B), 1, -1), dtype=np.int64).max())


# Digits as "0", everything else as " ": a run of N+1 digits is then one substring search.
_DIGITS = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))


def _long_number(raw: bytes, digits: int) -> bool:
    """Whether a number (not a string) in the JSON text `raw` has more than `digits` digits."""
    run = b"0" * (digits + 1)
    return run in raw.translate(_DIGITS) and run in _structure(raw).translate(_DIGITS)


class _DuplicateKey(ValueError):
    pass


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))  # type: ignore[func-returns-value]
        raise _DuplicateKey(twice)
    return value


def line_problem(raw: bytes, limits: Limits = LIMITS, inside: int = 0) -> str | None:
    """What makes the JSON text `raw` one the reader refuses, before it is parsed (nesting, long
    numbers), or None; `inside`: how deep `raw` sits in its line (the writer checks its pieces)."""
    if _long_number(raw, limits.max_digits):
        return f"a number of more than {limits.max_digits} digits"
    if raw.count(b"[") + raw.count(b"{") + inside > limits.max_depth and nesting(raw) + inside > limits.max_depth:
        return f"nested more than {limits.max_depth} deep"
    return None


def parse_line(raw: bytes, limits: Limits = LIMITS) -> Any:
    """The value of one line; ValueError saying what is wrong (the reader's limits)."""
    if (problem := line_problem(raw, limits)) is not None:
        raise ValueError(problem)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"not UTF-8 (byte {err.start})") from None
    try:
        return json.loads(text, object_pairs_hook=_object)
    except _DuplicateKey as err:
        raise ValueError(f"the key {json.dumps(str(err), ensure_ascii=True)} appears twice in one object") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"not a JSON line ({err.msg} at column {err.colno})") from None
    except RecursionError:
        raise ValueError(f"nested more than {limits.max_depth} deep") from None
    except ValueError as err:  # an integer past the interpreter's own digit bound
        raise ValueError(f"not a JSON line ({str(err).split(':')[0]})") from None


def records(handle: IO[bytes], gzipped: bool, limits: Limits = LIMITS) -> Iterator[Record]:
    """Each line of an open record file (see the module docstring); a fatal problem is the last."""
    lines = _lines(_inflated(handle, limits) if gzipped else _plain(handle), limits)
    number = 0
    offset = 0
    while True:
        try:
            item = next(lines, None)
        except _Stop as err:
            yield Record(number + 1, offset, offset, False, problem=str(err), fatal=True)
            return
        if item is None:
            return
        offset = item.end
        if item.raw is None:  # a run of blank lines: one record, numbered as the last of them
            number += item.blank
            yield Record(number, item.offset, item.end, True)
            continue
        number += 1
        if not item.raw.strip():
            yield Record(number, item.offset, item.end, item.terminated)
            continue
        try:
            yield Record(number, item.offset, item.end, item.terminated, value=parse_line(item.raw, limits))
        except ValueError as err:
            yield Record(number, item.offset, item.end, item.terminated, problem=str(err))


def is_gzip(path: Path) -> bool:
    return Path(path).suffix == ".gz"


def where(path: Path, record: Record) -> str:
    """`file: line N` for a message (the file's name escaped), as `check` prints its problems."""
    return f"{console(str(path))}: line {record.number}"


def read_groups(path: Path, limits: Limits = LIMITS, *, follow: bool = False) -> Iterator[dict[str, Any]]:
    """Yield the groups of a groups.jsonl (or .jsonl.gz); a line the reader refuses raises
    RecordFileError naming the file and the line (blank lines are skipped). `follow=True` follows
    a symbolic link named by the user; the file itself must be regular (a FIFO is refused)."""
    path = Path(path)
    with open_file(path, "rb", follow=follow) as handle:
        for record in records(handle, is_gzip(path), limits):
            if record.problem is not None:
                raise RecordFileError(f"{where(path, record)}: {console(record.problem)}", record.fatal)
            if not record.blank:
                yield record.value


def digest(value: Any) -> bytes:
    """A fingerprint of a JSON value, the same for equal values whatever their key order or
    spacing in the file (duplicate groups)."""
    try:
        canonical = msgspec.json.encode(value, order="sorted")
    except (TypeError, OverflowError, UnicodeEncodeError, msgspec.EncodeError):  # a lone surrogate: UnicodeEncodeError
        canonical = json.dumps(value, sort_keys=True, separators=(",", ":")).encode("utf-8", "surrogatepass")
    return hashlib.blake2b(canonical, digest_size=16).digest()


def fsize(handle: IO[bytes]) -> int:
    return os.fstat(handle.fileno()).st_size
