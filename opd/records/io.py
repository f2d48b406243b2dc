"""Reading and writing groups.jsonl: one flushed line per group, gzip optional, and recovery of
the valid head of a file left by a killed run."""

from __future__ import annotations

import gzip
import io
import json
import logging
import os
import zlib
from pathlib import Path
from typing import Any, Iterator

import msgspec

from opd.records.rules import is_valid

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


def group_line(group: dict[str, Any]) -> str:
    """One group as a line of JSON (no newline), the same values as `json.dumps` gives (see
    `line_parts`)."""
    return "".join(line_parts(group))


def line_parts(group: dict[str, Any]) -> list[str]:
    """A group's JSON line in pieces, written one after another (the line is never copied whole):
    the per-token arrays by msgspec, the rest by json, the same values as `json.dumps` gives. A NaN
    or infinity is refused (ValueError) as json refuses it: msgspec would write null, so a null in
    an array sends the whole group to json."""
    if not isinstance(group, dict):
        return [_json_line(group)]
    parts = ["{"]
    for key, value in group.items():
        if len(parts) > 1:
            parts.append(",")
        if key in _ARRAYS and value is not None:
            encoded = _encode_array(value)
            if b"null" in encoded:  # a NaN, an infinity (or a None) in the array: json decides
                return [_json_line(group)]
            parts += [f'"{key}":', encoded.decode()]
        elif isinstance(key, str):
            parts += [json.dumps(key, ensure_ascii=False), ":", _json_line(value)]
        else:  # json's own conversion of other keys
            return [_json_line(group)]
    parts.append("}")
    return parts


def _is_gzip(path: Path) -> bool:
    return path.suffix == ".gz"


def _gunzip(path: Path) -> str:
    """The text of a (possibly multi-member, possibly unterminated) gzip file: everything that was
    flushed, also when the writer was killed before writing the gzip trailer."""
    raw = path.read_bytes()
    out: list[bytes] = []
    while raw:
        inflater = zlib.decompressobj(wbits=31)
        out.append(inflater.decompress(raw))
        raw = inflater.unused_data
    return b"".join(out).decode("utf-8")


class GroupWriter:
    """Appends one group per line to a JSONL file; each line is flushed when written.

    A process killed at any point leaves every group that `write` returned for complete on disk
    (with `fsync=True`, also across power loss); at most a trailing partial line is lost. A path
    ending in `.gz` is written gzip-compressed with a sync flush per group, which keeps the same
    promise (`read_groups` and `python -m opd.records check` read both).
    """

    def __init__(self, path: Path, fsync: bool = False) -> None:
        self.path = path
        self.fsync = fsync
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = gzip.open(path, "at", encoding="utf-8", compresslevel=1) if _is_gzip(path) else open(path, "a", encoding="utf-8")
        self.written = 0

    def write(self, group: dict[str, Any]) -> None:
        self._file.writelines(line_parts(group))
        self._file.write("\n")
        self._file.flush()  # on a gzip file: a sync flush, so the line is decodable on disk
        if self.fsync:
            os.fsync(self._file.fileno())
        self.written += 1

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "GroupWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_groups(path: Path) -> Iterator[dict[str, Any]]:
    """Yield the groups of a groups.jsonl (or .jsonl.gz); raises ValueError naming the line of a bad one."""
    with (io.StringIO(_gunzip(path)) if _is_gzip(path) else open(path, encoding="utf-8")) as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                group = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number}: not a JSON line ({err.msg})") from None
            except RecursionError:  # a hostile file: JSON nested deeper than the parser goes
                raise ValueError(f"{path}:{number}: JSON nested too deeply to read") from None
            yield group


def recover(path: Path) -> list[dict[str, Any]]:
    """The valid groups at the head of a groups.jsonl left by a killed run; the file is cut
    after the last of them (a trailing partial line, or anything after a bad line, is dropped)."""
    if not path.exists():
        return []
    data = path.read_bytes()
    groups: list[dict[str, Any]] = []
    keep = 0
    start = 0
    while True:
        end = data.find(b"\n", start)
        if end < 0:
            break  # no newline: a partial last line
        line = data[start:end]
        if line.strip():
            try:
                group = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
                break
            if not isinstance(group, dict) or not is_valid(group):
                break
            groups.append(group)
        start = keep = end + 1
    if keep < len(data):
        logger.warning("%s: dropping %d bytes after the last valid group (a partial or bad line)", path, len(data) - keep)
        with open(path, "r+b") as handle:
            handle.truncate(keep)
    return groups
