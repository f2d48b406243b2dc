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
    """Every problem with one group, as short sentences; an empty list means valid."""
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
        self._file = gzip.open(path, "at", encoding="utf-8", compresslevel=6) if _is_gzip(path) else open(path, "a", encoding="utf-8")
        self.written = 0

    def write(self, group: dict[str, Any]) -> None:
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
