"""Writing groups.jsonl (one flushed line per group, gzip optional) and recovering the valid head
of a file left by a killed run. Reading is `opd.records.reader`: the writer never writes a line
that reader refuses, and recovery reads with it."""

from __future__ import annotations

import gzip
import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from opd.records.escape import console, json_text
from opd.records.reader import LIMITS, Limits, digest, is_gzip, line_problem, nesting, records, where
from opd.records.rules import is_valid
from opd.run_files import open_fd, open_file

logger = logging.getLogger(__name__)


def to_jsonable(value: Any) -> Any:
    """Plain JSON types for numpy scalars/arrays and tuples (atroposlib's writer raises on them)."""
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    return value


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


# The per-token arrays: nearly all of a group's bytes, encoded by msgspec (json's float repr cost
# ~1 ms per group of 8 x 500 tokens on the event loop; msgspec a quarter of that).
_ARRAYS = frozenset(("tokens", "masks", "inference_logprobs", "distill_token_ids", "distill_logprobs"))
_encode_array = msgspec.json.Encoder(enc_hook=_json_default).encode


def _json_line(value: Any) -> str:
    try:  # the C encoder straight away; numpy values go through `default`
        return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=_json_default)
    except TypeError:  # e.g. numpy dict keys: convert the whole tree first (slow path)
        return json.dumps(to_jsonable(value), ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _json_bytes(value: Any, limits: Limits, inside: int = 0) -> bytes:
    """`value` as JSON bytes, control and bidi characters escaped (`opd.records.escape`); a value
    the reader would refuse (nested too deep `inside` the line, a number too long) is a ValueError."""
    text = json_text(_json_line(value)).encode("utf-8")
    if (problem := line_problem(text, limits, inside)) is not None:
        raise ValueError(f"the group cannot be written: its line would be refused by the reader ({problem})")
    return text


def group_line(group: dict[str, Any]) -> str:
    """One group as a line of JSON (no newline), the same values as `json.dumps` gives (see
    `line_parts`)."""
    return b"".join(line_parts(group)).decode("utf-8")


def line_parts(group: dict[str, Any], limits: Limits = LIMITS) -> list[bytes]:
    """A group's JSON line in pieces, written one after another (the line is never copied whole):
    the per-token arrays by msgspec, the rest by json, the same values as `json.dumps` gives. A NaN
    or infinity is refused (ValueError) as json refuses it: msgspec would write null, so a null in
    an array sends the whole group to json (a string in one too: json escapes it). Strings are
    escaped as `opd.records.escape.json_text` says; a group the reader would refuse is refused."""
    if not isinstance(group, dict):
        return [_json_bytes(group, limits)]
    parts = [b"{"]
    for key, value in group.items():
        if len(parts) > 1:
            parts.append(b",")
        if key in _ARRAYS and value is not None:
            encoded = _encode_array(value)
            if b"null" in encoded or b'"' in encoded:  # a NaN, an infinity, a None or a string in the array: json decides
                return [_json_bytes(group, limits)]
            if nesting(encoded) + 1 > limits.max_depth:  # numbers only: their digits are msgspec's, nesting is the caller's
                return [_json_bytes(group, limits)]  # refused there, with the reason
            parts += [b'"', key.encode("ascii"), b'":', encoded]
        elif isinstance(key, str):
            parts += [_json_bytes(key, limits), b":", _json_bytes(value, limits, 1)]
        else:  # json's own conversion of other keys
            return [_json_bytes(group, limits)]
    parts.append(b"}")
    return parts


def _write_all(fd: int, parts: list[bytes]) -> None:
    """Every byte of `parts` to `fd`, in order (writev; a short write goes on where it stopped)."""
    views = [memoryview(p) for p in parts if p]
    while views:
        written = os.writev(fd, views[:512])
        while views and written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        if written:
            views[0] = views[0][written:]


class GroupWriter:
    """Appends one group per line to a JSONL file; each line is on disk when `write` returns.

    A process killed at any point leaves every group that `write` returned for complete on disk
    (with `fsync=True`, also across power loss); at most a trailing partial line is lost; a write
    that fails (a full disk) takes its partial line back. A path ending in `.gz` is written
    gzip-compressed with a sync flush per group, which keeps the same promise (`read_groups` and
    `python -m opd.records check` read both). The file is opened as `opd.run_files` opens a run's
    files: a link, a FIFO or a file with other names in its place is refused. A group whose line
    `opd.records.reader` would refuse (longer than its cap, nested too deep) is a ValueError,
    and nothing of it is written.
    """

    def __init__(self, path: Path, fsync: bool = False, limits: Limits = LIMITS) -> None:
        self.path = path
        self.fsync = fsync
        self.limits = limits
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = open_fd(path, "a")
        self._file = os.fdopen(self._fd, "ab")
        self._gzip = gzip.GzipFile(fileobj=self._file, mode="ab", compresslevel=1) if is_gzip(path) else None
        self.written = 0

    def write(self, group: dict[str, Any]) -> None:
        parts = line_parts(group, self.limits)
        size = sum(map(len, parts))
        if size > self.limits.max_line_bytes:
            raise ValueError(f"the group cannot be written: its line of {size} bytes is longer than the reader's cap ({self.limits.max_line_bytes})")
        parts.append(b"\n")
        if self._gzip is not None:
            self._gzip.writelines(parts)
            self._gzip.flush()  # a sync flush: the line is decodable on disk
            self._file.flush()
        else:
            start = os.fstat(self._fd).st_size
            try:
                _write_all(self._fd, parts)
            except BaseException:
                os.ftruncate(self._fd, start)
                raise
        if self.fsync:
            os.fsync(self._fd)
        self.written += 1

    def close(self) -> None:
        try:
            if self._gzip is not None:
                self._gzip.close()
        finally:
            self._file.close()

    def __enter__(self) -> "GroupWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Recovered:
    """What `recover` kept of a killed run's groups.jsonl, and what it took out."""

    groups: list[dict[str, Any]] = field(default_factory=list)
    # Groups equal to an earlier one (whatever their key order or spacing), dropped.
    duplicates: int = 0
    # Bytes cut after the last valid group, and why (`file:line: ...`; None when nothing was cut).
    cut_bytes: int = 0
    cut_because: str | None = None


def recover(path: Path, limits: Limits = LIMITS) -> Recovered:
    """The valid groups at the head of a groups.jsonl left by a killed run, each once. The file is
    cut after the last of them (a trailing partial line, or anything from a line the reader or the
    record rules refuse on, is dropped); a group equal to an earlier one is dropped from it
    (counted). The file is opened as every run file is (`opd.run_files`): a link, a FIFO or a file
    with other names is refused before anything is read or changed."""
    if not os.path.lexists(path):
        return Recovered()
    out = Recovered()
    with open_file(path, "r+b") as handle:
        seen: dict[bytes, int] = {}
        spans: list[tuple[int, int]] = []
        repeats: list[str] = []
        keep = 0
        for record in records(handle, False, limits):
            if not record.terminated:  # what a killed writer leaves, or a line the reader cannot get past
                out.cut_because = f"{where(path, record)}: " + (console(record.problem) if record.fatal else "a partial last line (no newline)")
                break
            if record.blank:
                keep = record.end
                continue
            problem = record.problem or (None if isinstance(record.value, dict) and is_valid(record.value) else "not a valid group")
            if problem is not None:
                out.cut_because = f"{where(path, record)}: {console(problem)}"
                break
            fingerprint = digest(record.value)
            if fingerprint in seen:
                out.duplicates += 1
                if len(repeats) < 5:
                    repeats.append(f"line {record.number} repeats line {seen[fingerprint]}")
            else:
                seen[fingerprint] = record.number
                out.groups.append(record.value)
                spans.append((record.start, record.end))
            keep = record.end
        size = os.fstat(handle.fileno()).st_size
        out.cut_bytes = size - keep
        if out.duplicates:
            logger.warning("%s: %d duplicate groups dropped, one of each kept (%s%s)", console(str(path)), out.duplicates, "; ".join(repeats),
                           "; ..." if out.duplicates > len(repeats) else "")
            _rewrite(handle, path, spans)
        elif out.cut_bytes:
            handle.truncate(keep)
        if out.cut_bytes:
            logger.warning("%s: dropping %d bytes after the last valid group (%s)", console(str(path)), out.cut_bytes, out.cut_because or "a partial last line")
    return out


def _rewrite(handle: Any, path: Path, spans: list[tuple[int, int]]) -> None:
    """Replace `path` (open as `handle`) with the lines at `spans` of it, in order: written to a
    fresh name beside it, synced, renamed over it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            for start, end in spans:
                handle.seek(start)
                left = end - start
                while left:
                    chunk = handle.read(min(left, 1 << 20))
                    if not chunk:
                        raise OSError(f"{path} changed while it was rewritten")
                    out.write(chunk)
                    left -= len(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, os.fstat(handle.fileno()).st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
