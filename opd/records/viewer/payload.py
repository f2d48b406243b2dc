"""One group packed for the viewer: numeric rows as little-endian integer arrays, the rest as
JSON, deflated together (the page inflates a group only when it is opened).

Layout of the inflated bytes: a uint32 (the offset of the JSON), the arrays, then the JSON:

    {"group_overrides": {...}, "generation_params": {...}, "scales": {array: units per nat},
     "sequences": [{"score": s, "details": overrides[i] without teacher_logprobs,
                    "messages": [...] | null, "arrays": {name: [dtype, offset, length]}}, ...]}

Each array is stored byte-plane by byte-plane (all first bytes, then all second bytes, ...), so
that deflate sees the long runs of equal high bytes; the page interleaves them back.

Arrays per sequence (positions index `tokens`):
- `tokens`: the ids; `generated`: [start, end) pairs of the runs of unmasked positions;
- `student`: `inference_logprobs` on generated positions, in order;
- `rows`: the positions with a teacher row or a teacher logprob, ascending; `teacher`: the
  teacher's logprob there (`NO_LOGPROB` where null); `row_sizes`: how many top-K entries each
  position keeps (pads dropped); `row_ids` / `row_logprobs`: those entries, flat.
Logprobs are int32 in `SCALES` units: milli-nats for the student's and the teacher's logprob of
each token (the page shows three decimals and their difference), centi-nats for the top-K
alternatives (two decimals; they are most of a page, and each decimal costs ~3 bits a value).
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

import numpy as np

from opd.records.format import DISTILL_PAD_ID, MASK

NO_LOGPROB = int(np.iinfo(np.int32).min)  # a null teacher logprob
SCALES = {"student": 1000, "teacher": 1000, "row_logprobs": 100}
# The deflate level: 1 is ~5x faster to write than 6 and ~10% larger on these arrays.
LEVEL = 1


def _scaled(values: Any, name: str) -> np.ndarray:
    """Logprobs in `SCALES[name]` units, clipped to what int32 holds (NO_LOGPROB excluded)."""
    scaled = np.round(np.asarray(values, dtype=np.float64) * SCALES[name])
    return np.clip(scaled, NO_LOGPROB + 1, 2**31 - 1).astype("<i4")


def _ids(values: Any) -> np.ndarray:
    """Token ids as uint16 where they fit (vocabularies up to 65,536), else uint32; ValueError for
    an id outside [0, 2^32) (none is a token of any vocabulary)."""
    try:
        array = np.asarray(values, dtype=np.int64)
    except OverflowError:
        raise ValueError("token ids must be below 2^32") from None
    if array.size and (array.min() < 0 or array.max() >= 2**32):
        raise ValueError(f"token ids must be in [0, 2^32): found {int(array.min() if array.min() < 0 else array.max())}")
    return array.astype("<u2" if array.size == 0 or array.max() < 2**16 else "<u4")


def _runs(flags: np.ndarray) -> np.ndarray:
    """[start, end) pairs of the runs of True in `flags`, flat."""
    edges = np.diff(np.concatenate(([0], flags.astype(np.int8), [0])))
    return np.stack([np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)], axis=1).reshape(-1).astype("<u4")


def sequence_arrays(group: dict[str, Any], i: int) -> dict[str, np.ndarray]:
    """Sequence `i`'s arrays (see the module docstring)."""
    generated = np.asarray(group["masks"][i]) != MASK
    arrays = {"tokens": _ids(group["tokens"][i]), "generated": _runs(generated)}
    student = (group.get("inference_logprobs") or [None] * (i + 1))[i]
    arrays["student"] = _scaled(student, "student")[generated] if student is not None else _scaled([], "student")
    details = (group.get("overrides") or [{}] * (i + 1))[i]
    teacher = details.get("teacher_logprobs") or []
    ids_rows = (group.get("distill_token_ids") or [None] * (i + 1))[i] or []
    # A pad row is pads only (a rule of the format), so its first entry tells.
    rows = sorted({p for p, v in enumerate(teacher) if v is not None} | {p for p, row in enumerate(ids_rows) if row and row[0] != DISTILL_PAD_ID})
    arrays["rows"] = np.asarray(rows, dtype="<u4")
    known = [p for p in rows if p < len(teacher) and teacher[p] is not None]
    arrays["teacher"] = np.full(len(rows), NO_LOGPROB, dtype="<i4")
    arrays["teacher"][np.searchsorted(arrays["rows"], known)] = _scaled([teacher[p] for p in known], "teacher")
    with_row = [p for p in rows if p < len(ids_rows) and ids_rows[p] and ids_rows[p][0] != DISTILL_PAD_ID]
    k = len(ids_rows[with_row[0]]) if with_row else 0
    ids = np.asarray([ids_rows[p] for p in with_row], dtype=np.int64).reshape(len(with_row), k)
    lps = np.asarray([group["distill_logprobs"][i][p] for p in with_row], dtype=np.float64).reshape(len(with_row), k)
    real = ids != DISTILL_PAD_ID
    sizes = np.zeros(len(rows), dtype="<u2")
    sizes[np.searchsorted(arrays["rows"], with_row)] = real.sum(axis=1)
    arrays["row_sizes"] = sizes
    arrays["row_ids"] = _ids(ids[real])
    arrays["row_logprobs"] = _scaled(lps[real], "row_logprobs")
    return arrays


def byte_planes(array: np.ndarray) -> bytes:
    """The array's bytes, plane by plane: byte 0 of every value, then byte 1, ..."""
    return np.ascontiguousarray(array).view(np.uint8).reshape(-1, array.itemsize).T.tobytes()


def pack_group(group: dict[str, Any]) -> tuple[bytes, list[np.ndarray]]:
    """(the deflated group, the id arrays in it: `tokens` and `row_ids` of every sequence)."""
    chunks: list[bytes] = [b""]
    offset = 4
    sequences = []
    id_arrays = []
    details = group.get("overrides") or [{} for _ in group["tokens"]]
    messages = group.get("messages") or [None] * len(group["tokens"])
    for i, score in enumerate(group["scores"]):
        arrays = sequence_arrays(group, i)
        id_arrays += [arrays["tokens"], arrays["row_ids"]]
        described = {}
        for name, array in arrays.items():
            described[name] = [array.dtype.str[1:], offset, int(array.size)]
            chunks.append(byte_planes(array))
            offset += len(chunks[-1])
        sequences.append({"score": score, "details": {k: v for k, v in details[i].items() if k != "teacher_logprobs"},
                          "messages": messages[i], "arrays": described})
    meta = {"group_overrides": group.get("group_overrides") or {}, "generation_params": group.get("generation_params") or {},
            "scales": SCALES, "sequences": sequences}
    chunks[0] = struct.pack("<I", offset)
    # No NaN or Infinity: the page's JSON.parse refuses them (ValueError: the group is not shown, and said so).
    chunks.append(json.dumps(meta, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8"))
    return zlib.compress(b"".join(chunks), LEVEL), id_arrays
