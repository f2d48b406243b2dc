"""The record format: Atropos `ScoredDataGroup` groups, one JSON object per line of groups.jsonl.

Per group (lists are per sequence, inner lists per token position):
- `tokens` [seq][pos]: prompt + sampled token ids, exactly as the server saw and produced them.
- `masks` [seq][pos]: the token id where the model generated it (trained), -100 elsewhere
  (prompt, and text the environment inserted, such as tool responses).
- `inference_logprobs` [seq][pos]: the sampling model's logprob of each generated token;
  `MASKED_LOGPROB` (1.0, atroposlib's convention: not a log probability) on masked positions.
- `scores` [seq]: the reward. `overrides` [seq]: per-sequence details (reward signals, tool calls).
- `distill_token_ids` / `distill_logprobs` [seq][pos][K] (OPD only): see the README.

`check_group` lists everything wrong with a group; the runner refuses to write a group that has
problems, and `python -m opd.validate FILE` applies the same checks to a file.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import math
import os
import zlib
from pathlib import Path
from typing import Any, Iterator

import numpy as np

logger = logging.getLogger(__name__)

MASK = -100
# Logprob stored at positions the model did not generate (atroposlib's placeholder).
MASKED_LOGPROB = 1.0
# Pads of distill rows at positions without a teacher row: no real token has id -1, and
# e^-1e9 is 0, so a pad can never be read as a prediction.
DISTILL_PAD_ID = -1
DISTILL_PAD_LOGPROB = -1e9

_PER_POSITION = ("masks", "inference_logprobs")


def check_group(group: dict[str, Any]) -> list[str]:
    """Every problem with one group, as short sentences; an empty list means valid.

    A vectorised pass (numpy) accepts the usual valid group in a few milliseconds even at 16k
    tokens x K=50; anything it does not accept is re-checked position by position for the message.
    """
    try:
        if _fast_valid(group):
            return []
    except (TypeError, ValueError, OverflowError):
        pass
    return _check_slowly(group)


def _ints(values: Any, ndim: int) -> Any:
    array = np.asarray(values)
    return array if array.ndim == ndim and array.dtype.kind in "iu" else None


def _floats(values: Any, ndim: int) -> Any:
    array = np.asarray(values)
    return array if array.ndim == ndim and array.dtype.kind in "iuf" else None


def _fast_valid(group: dict[str, Any]) -> bool:
    """True only for groups `_check_slowly` also accepts (never the other way round)."""
    tokens, masks, scores = group.get("tokens"), group.get("masks"), group.get("scores")
    if not isinstance(tokens, list) or not tokens or not isinstance(masks, list) or not isinstance(scores, list):
        return False
    n = len(tokens)
    if len(masks) != n or len(scores) != n:
        return False
    if not all(type(s) in (int, float) and math.isfinite(s) for s in scores):
        return False
    logprobs = group.get("inference_logprobs")
    if logprobs is not None and (not isinstance(logprobs, list) or len(logprobs) != n):
        return False
    ids_all, lps_all = group.get("distill_token_ids"), group.get("distill_logprobs")
    distill = ids_all is not None or lps_all is not None
    if distill and (not isinstance(ids_all, list) or not isinstance(lps_all, list) or len(ids_all) != n or len(lps_all) != n):
        return False
    k = None
    for i in range(n):
        if not isinstance(tokens[i], list) or not isinstance(masks[i], list):
            return False
        t, m = _ints(tokens[i], 1), _ints(masks[i], 1)
        if t is None or m is None or t.size == 0 or m.shape != t.shape or (t < 0).any():
            return False
        generated = m != MASK
        if not generated.any() or (generated & (m != t)).any():
            return False
        if logprobs is not None:
            lp = _floats(logprobs[i], 1)
            if lp is None or lp.shape != t.shape or not np.isfinite(lp).all():
                return False
            if (generated & (lp > 0)).any() or (~generated & (lp != MASKED_LOGPROB)).any():
                return False
        if distill:
            ids, lps = _ints(ids_all[i], 2), _floats(lps_all[i], 2)
            if ids is None or lps is None or ids.shape != lps.shape or ids.shape[0] != t.size or ids.shape[1] == 0:
                return False
            k = ids.shape[1] if k is None else k
            if ids.shape[1] != k:
                return False
            pad = ids == DISTILL_PAD_ID
            pad_rows = pad.all(axis=1)
            if (pad.any(axis=1) & ~pad_rows).any() or (lps[pad_rows] != DISTILL_PAD_LOGPROB).any():
                return False
            rows = ~pad_rows
            if (rows & ~generated).any():
                return False
            row_ids, row_lps = ids[rows], lps[rows]
            if (row_ids < 0).any() or not np.isfinite(row_lps).all() or (row_lps > 0).any() or (row_lps[:, :-1] < row_lps[:, 1:]).any():
                return False
    return True


def _check_slowly(group: dict[str, Any]) -> list[str]:
    """Position by position, naming the first problem of each kind."""
    problems: list[str] = []
    tokens = group.get("tokens")
    if not isinstance(tokens, list) or not tokens:
        return ["tokens must be a non-empty list of sequences"]
    n = len(tokens)
    for key in ("masks", "scores"):
        if not isinstance(group.get(key), list) or len(group[key]) != n:
            problems.append(f"{key} must have one entry per sequence ({n})")
    if problems:
        return problems
    for i, score in enumerate(group["scores"]):
        if not isinstance(score, (int, float)) or isinstance(score, bool) or not math.isfinite(score):
            problems.append(f"scores[{i}] is not a finite number: {score!r}")
    logprobs = group.get("inference_logprobs")
    if logprobs is not None and (not isinstance(logprobs, list) or len(logprobs) != n):
        problems.append(f"inference_logprobs must have one entry per sequence ({n})")
        logprobs = None
    for i in range(n):
        seq, masks = tokens[i], group["masks"][i]
        if not seq or not all(isinstance(t, int) and t >= 0 for t in seq):
            problems.append(f"tokens[{i}] must be non-empty non-negative ints")
            continue
        if len(masks) != len(seq):
            problems.append(f"masks[{i}] has {len(masks)} entries for {len(seq)} tokens")
            continue
        bad_mask = next((p for p, (m, t) in enumerate(zip(masks, seq)) if m != MASK and m != t), None)
        if bad_mask is not None:
            problems.append(f"masks[{i}][{bad_mask}] is neither -100 nor the token id")
        if all(m == MASK for m in masks):
            problems.append(f"masks[{i}] masks every position (nothing to train)")
        if logprobs is not None:
            lp = logprobs[i]
            if len(lp) != len(seq):
                problems.append(f"inference_logprobs[{i}] has {len(lp)} entries for {len(seq)} tokens")
                continue
            for p, (value, mask) in enumerate(zip(lp, masks)):
                if not isinstance(value, (int, float)) or not math.isfinite(value):
                    problems.append(f"inference_logprobs[{i}][{p}] is not finite: {value!r}")
                    break
                if mask != MASK and value > 0:
                    problems.append(f"inference_logprobs[{i}][{p}] is {value} on a generated token (must be <= 0)")
                    break
                if mask == MASK and value != MASKED_LOGPROB:
                    problems.append(f"inference_logprobs[{i}][{p}] on a masked position must be {MASKED_LOGPROB}")
                    break
    if group.get("distill_token_ids") is not None or group.get("distill_logprobs") is not None:
        problems += _check_distill(group)
    return problems


def _check_distill(group: dict[str, Any]) -> list[str]:
    """K entries per row, pads only where no teacher row exists, rows only on generated tokens."""
    ids, lps, tokens, masks = group.get("distill_token_ids"), group.get("distill_logprobs"), group["tokens"], group["masks"]
    if not isinstance(ids, list) or not isinstance(lps, list) or len(ids) != len(tokens) or len(lps) != len(tokens):
        return ["distill_token_ids and distill_logprobs must both have one entry per sequence"]
    k = None
    for i, (seq_ids, seq_lps) in enumerate(zip(ids, lps)):
        if len(seq_ids) != len(tokens[i]) or len(seq_lps) != len(tokens[i]):
            return [f"distill arrays of sequence {i} must have one row per token ({len(tokens[i])})"]
        for p, (row_ids, row_lps) in enumerate(zip(seq_ids, seq_lps)):
            k = len(row_ids) if k is None else k
            where = f"distill row [{i}][{p}]"
            if len(row_ids) != k or len(row_lps) != k or k == 0:
                return [f"{where} has {len(row_ids)} ids / {len(row_lps)} logprobs, expected K={k}"]
            pads = [t == DISTILL_PAD_ID for t in row_ids]
            if any(pads):
                if not all(pads) or any(lp != DISTILL_PAD_LOGPROB for lp in row_lps):
                    return [f"{where} mixes pads and teacher entries"]
                continue
            if masks[i][p] == MASK:
                return [f"{where} is a teacher row on a masked (not generated) position"]
            if any(t < 0 for t in row_ids) or any(not isinstance(lp, (int, float)) or not math.isfinite(lp) or lp > 0 for lp in row_lps):
                return [f"{where} has a negative id or a logprob that is not finite and <= 0"]
            if any(a < b for a, b in zip(row_lps, row_lps[1:])):
                return [f"{where} is not sorted by logprob"]
    return []


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
    promise (`read_groups` and `python -m opd.validate` read both).
    """

    def __init__(self, path: Path, fsync: bool = False) -> None:
        self.path = path
        self.fsync = fsync
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = gzip.open(path, "at", encoding="utf-8", compresslevel=1) if _is_gzip(path) else open(path, "a", encoding="utf-8")
        self.written = 0

    def write(self, group: dict[str, Any]) -> None:
        try:  # the C encoder straight away; numpy values go through `default`
            line = json.dumps(group, ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=_json_default)
        except TypeError:  # e.g. numpy dict keys: convert the whole tree first (slow path)
            line = json.dumps(to_jsonable(group), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        self._file.write(line + "\n")
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
                yield json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number}: not a JSON line ({err.msg})") from None


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
            except (json.JSONDecodeError, UnicodeDecodeError):
                break
            if not isinstance(group, dict) or check_group(group):
                break
            groups.append(group)
        start = keep = end + 1
    if keep < len(data):
        logger.warning("%s: dropping %d bytes after the last valid group (a partial or bad line)", path, len(data) - keep)
        with open(path, "r+b") as handle:
            handle.truncate(keep)
    return groups
