"""The rules every group must satisfy, written once as a list of named checks.

Layers, each run only when the one before holds:
- group rules: the fields are lists with one entry per sequence;
- field rules: every other field the format names has its type (`opd.records.fields`) and lines
  up with the sequences and their tokens (checked beside the next two layers, not before them);
- shape rules (per sequence): the rows convert to numeric arrays of matching shapes;
- value rules (per sequence, vectorised): masks, logprobs and teacher rows are consistent.

`check_group` runs every rule and lists every problem (one sentence per broken rule and
sequence, naming the first position); `is_valid` runs the same list and stops at the first
problem (the runner's check before a group is written). Both read `RULES`, so they cannot
disagree; `tests/test_records.py` checks that on randomly mutated groups.
"""

from __future__ import annotations

import reprlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import msgspec
import numpy as np

from opd.records import fields
from opd.records.format import DISTILL_PAD_ID, DISTILL_PAD_LOGPROB, MASK, MASKED_LOGPROB
from opd.registry import Registry


@dataclass
class SequenceView:
    """One sequence's rows as arrays (filled in by the shape rules)."""

    index: int
    score: Any
    raw: dict[str, Any]  # the sequence's raw lists, by field name
    tokens: np.ndarray | None = None
    masks: np.ndarray | None = None
    generated: np.ndarray | None = None
    logprobs: np.ndarray | None = None
    teacher_ids: np.ndarray | None = None
    teacher_logprobs: np.ndarray | None = None
    # The teacher kind the group says scored every sampled token (`group_overrides.teacher`, e.g.
    # model; any kind's name); None: no such claim (no teacher, or the self-hint teacher's hinted turns).
    taught_by: str | None = None


@dataclass(frozen=True)
class Rule:
    """A named check: `check` returns None when the rule holds, else a sentence saying where not."""

    name: str
    layer: str  # group | shape | value
    check: Callable[..., str | None]


# The rules by name, in the order they run within their layer (a name registered twice is refused).
RULES: Registry[Rule] = Registry("record rule")
LAYERS = ("group", "field", "shape", "value")


def rule(layer: str) -> Callable[[Callable[..., str | None]], Callable[..., str | None]]:
    """Register the decorated check as a rule of `layer` under its function's name."""
    if layer not in LAYERS:
        raise ValueError(f"a record rule's layer is one of {LAYERS}, got {layer!r}")

    def register(check: Callable[..., str | None]) -> Callable[..., str | None]:
        RULES.add(check.__name__, Rule(check.__name__, layer, check), layer=layer)
        return check

    return register


def _first(mask: np.ndarray) -> int | None:
    hits = np.flatnonzero(mask)
    return int(hits[0]) if hits.size else None


# Plain Python ints (no bool), or ints and floats, as 1-D or 2-D lists: msgspec checks an element's
# type in C, and numpy then converts to the dtype named, without inferring it element by element.
_PLAIN = {("iu", 1): (list[int], np.int64), ("iuf", 1): (list[float], np.float64),
          ("iu", 2): (list[list[int]], np.int64), ("iuf", 2): (list[list[float]], np.float64)}


def _array(values: Any, kinds: str, ndim: int) -> np.ndarray | None:
    """`values` as an array of one of the numpy `kinds` with `ndim` dimensions, else None (also
    when a JSON boolean hides among the numbers: numpy would read it as 1 or 0)."""
    if not isinstance(values, list):
        return None
    plain = _PLAIN.get((kinds, ndim))
    if plain is not None:
        try:
            msgspec.convert(values, plain[0])
        except msgspec.ValidationError:
            pass  # not plain (numpy scalars, bools, strings, ...): numpy's reading below decides
        else:
            try:
                array = np.array(values, dtype=plain[1])
            except (ValueError, OverflowError):  # ragged rows, an int past 64 bits
                return None
            return None if array.ndim != ndim or (ndim == 2 and array.shape[1] == 0) else array
    try:
        array = np.asarray(values)
    except (ValueError, TypeError, OverflowError):  # ragged or mixed
        return None
    if array.ndim != ndim or array.dtype.kind not in kinds or (ndim == 2 and array.shape[1] == 0):
        return None
    types = set(map(type, values)) if ndim == 1 else {t for row in values for t in set(map(type, row))}
    return None if bool in types else array


# ---- group rules ---------------------------------------------------------------------------


@rule("group")
def tokens_are_sequences(group: dict[str, Any]) -> str | None:
    tokens = group.get("tokens")
    return None if isinstance(tokens, list) and tokens else "tokens must be a non-empty list of sequences"


@rule("group")
def one_entry_per_sequence(group: dict[str, Any]) -> str | None:
    n = len(group["tokens"])
    for key, required in (("masks", True), ("scores", True), ("inference_logprobs", False)):
        value = group.get(key)
        if (value is not None or required) and (not isinstance(value, list) or len(value) != n):
            return f"{key} must have one entry per sequence ({n})"
    return None


@rule("group")
def distill_arrays_come_together(group: dict[str, Any]) -> str | None:
    ids, lps, n = group.get("distill_token_ids"), group.get("distill_logprobs"), len(group["tokens"])
    if ids is None and lps is None:
        return None
    if not isinstance(ids, list) or not isinstance(lps, list) or len(ids) != n or len(lps) != n:
        return "distill_token_ids and distill_logprobs must both have one entry per sequence"
    return None


@rule("group")
def distill_k_is_the_same_everywhere(group: dict[str, Any]) -> str | None:
    """Every sequence's first teacher row has the same K (rows within a sequence: a shape rule)."""
    firsts = [seq[0] for seq in group.get("distill_token_ids") or [] if isinstance(seq, list) and seq and isinstance(seq[0], list)]
    ks = sorted({len(row) for row in firsts})
    return None if len(ks) <= 1 else f"distill rows have different K in different sequences ({ks})"


# ---- field rules (the group; the first broken one stops this layer only) ---------------------


@rule("field")
def fields_have_their_types(group: dict[str, Any]) -> str | None:
    for key, kind in fields.GROUP.fields.items():
        if key in group and (problem := fields.problem(group[key], kind, key)):
            return problem
    return None


@rule("field")
def details_line_up_with_sequences(group: dict[str, Any]) -> str | None:
    """Per-sequence fields have one entry per sequence; per-token ones one per token; judged
    turns' spans lie within their sequence."""
    n = len(group["tokens"])
    for key in ("overrides", "messages", "advantages", "ref_logprobs"):
        value = group.get(key)
        if value is not None and len(value) != n:
            return f"{key} must have one entry per sequence ({n}), not {len(value)}"
    for i, detail in enumerate(group.get("overrides") or []):
        tokens = group["tokens"][i]
        length = len(tokens) if isinstance(tokens, list) else 0
        teacher = detail.get("teacher_logprobs")
        if teacher is not None and len(teacher) != length:
            return f"overrides[{i}].teacher_logprobs has {len(teacher)} entries for {length} tokens"
        for j, turn in enumerate(detail.get("opd_turns") or []):
            if "span" in turn and turn["span"][1] > length:
                return f"overrides[{i}].opd_turns[{j}].span {turn['span']} ends past the sequence's {length} tokens"
    for key in ("advantages", "ref_logprobs"):
        for i, row in enumerate(group.get(key) or []):
            tokens = group["tokens"][i]
            if row is not None and isinstance(tokens, list) and len(row) != len(tokens):
                return f"{key}[{i}] has {len(row)} entries for {len(tokens)} tokens"
    return None


@rule("field")
def sequences_fit_the_context(group: dict[str, Any]) -> str | None:
    """No sequence is longer than the context of the run that wrote it
    (`generation_params.max_model_len`, the server's `--max-model-len`): a trainer or atroposlib
    (`max_token_length`) cannot take one that is."""
    params = group.get("generation_params")
    limit = params.get("max_model_len") if isinstance(params, dict) else None
    if limit is None:
        return None
    if type(limit) is not int or limit < 1:
        return f"generation_params.max_model_len must be a positive int, not {limit!r}"
    for i, tokens in enumerate(group["tokens"]):
        if isinstance(tokens, list) and len(tokens) > limit:
            return f"tokens[{i}] has {len(tokens)} tokens, more than the run's context (generation_params.max_model_len={limit})"
    return None


# ---- shape rules (per sequence; each may fill the view) ------------------------------------


@rule("shape")
def tokens_are_token_ids(view: SequenceView) -> str | None:
    view.tokens = _array(view.raw["tokens"], "iu", 1)
    if view.tokens is None or view.tokens.size == 0 or (view.tokens < 0).any():
        return f"tokens[{view.index}] must be non-empty non-negative ints"
    return None


def _aligned(view: SequenceView, field: str, kinds: str, what: str) -> tuple[np.ndarray | None, str | None]:
    """The sequence's `field` as an array with one entry per token, or the problem with it."""
    values = view.raw[field]
    if not isinstance(values, list) or len(values) != view.tokens.size:
        return None, f"{field}[{view.index}] has {len(values) if isinstance(values, list) else 0} entries for {view.tokens.size} tokens"
    array = _array(values, kinds, 1)
    return array, None if array is not None else f"{field}[{view.index}] must be {what}"


@rule("shape")
def masks_align_with_tokens(view: SequenceView) -> str | None:
    view.masks, problem = _aligned(view, "masks", "iu", "ints")
    if view.masks is not None:
        view.generated = view.masks != MASK
    return problem


@rule("shape")
def logprobs_align_with_tokens(view: SequenceView) -> str | None:
    if "inference_logprobs" not in view.raw:
        return None
    view.logprobs, problem = _aligned(view, "inference_logprobs", "iuf", "a list of numbers")
    return problem


@rule("shape")
def distill_rows_have_k_entries(view: SequenceView) -> str | None:
    if "distill_token_ids" not in view.raw:
        return None
    ids, lps, n = view.raw["distill_token_ids"], view.raw["distill_logprobs"], view.tokens.size
    if not isinstance(ids, list) or not isinstance(lps, list) or len(ids) != n or len(lps) != n:
        return f"distill arrays of sequence {view.index} must have one row per token ({n})"
    view.teacher_ids, view.teacher_logprobs = _array(ids, "iu", 2), _array(lps, "iuf", 2)
    if view.teacher_ids is None or view.teacher_logprobs is None or view.teacher_ids.shape != view.teacher_logprobs.shape:
        k = len(ids[0]) if isinstance(ids[0], list) else 0
        for p, (row_ids, row_lps) in enumerate(zip(ids, lps)):
            if not isinstance(row_ids, list) or not isinstance(row_lps, list) or not (len(row_ids) == len(row_lps) == k) or k == 0:
                got = (len(row_ids) if isinstance(row_ids, list) else 0, len(row_lps) if isinstance(row_lps, list) else 0)
                return f"distill row [{view.index}][{p}] has {got[0]} ids / {got[1]} logprobs, expected K={k}"
        return f"distill rows of sequence {view.index} are not numbers (ids must be ints)"
    return None


# ---- value rules (per sequence, vectorised) -------------------------------------------------


@rule("value")
def score_is_finite(view: SequenceView) -> str | None:
    score = view.score
    if fields.is_finite_number(score):
        return None
    if isinstance(score, np.generic) and not isinstance(score, np.bool_) and np.isfinite(score):
        return None
    return f"scores[{view.index}] is not a finite number (within float64's range): {reprlib.repr(score)}"


@rule("value")
def mask_is_token_or_mask(view: SequenceView) -> str | None:
    bad = _first(view.generated & (view.masks != view.tokens))
    return None if bad is None else f"masks[{view.index}][{bad}] is neither -100 nor the token id"


@rule("value")
def something_is_trained(view: SequenceView) -> str | None:
    return None if view.generated.any() else f"masks[{view.index}] masks every position (nothing to train)"


@rule("value")
def logprobs_are_finite(view: SequenceView) -> str | None:
    if view.logprobs is None:
        return None
    bad = _first(~np.isfinite(view.logprobs))
    return None if bad is None else f"inference_logprobs[{view.index}][{bad}] is not finite: {view.logprobs[bad]!r}"


@rule("value")
def generated_logprobs_are_log_probabilities(view: SequenceView) -> str | None:
    if view.logprobs is None:
        return None
    bad = _first(view.generated & (view.logprobs > 0))
    return None if bad is None else f"inference_logprobs[{view.index}][{bad}] is {view.logprobs[bad]} on a generated token (must be <= 0)"


@rule("value")
def masked_logprobs_are_the_placeholder(view: SequenceView) -> str | None:
    if view.logprobs is None:
        return None
    bad = _first(~view.generated & (view.logprobs != MASKED_LOGPROB))
    return None if bad is None else f"inference_logprobs[{view.index}][{bad}] on a masked position must be {MASKED_LOGPROB}"


@rule("value")
def pads_fill_whole_rows(view: SequenceView) -> str | None:
    if view.teacher_ids is None:
        return None
    pad = view.teacher_ids == DISTILL_PAD_ID
    bad = _first(pad.any(axis=1) & ~pad.all(axis=1))
    if bad is None:
        bad = _first(pad.all(axis=1) & (view.teacher_logprobs != DISTILL_PAD_LOGPROB).any(axis=1))
    return None if bad is None else f"distill row [{view.index}][{bad}] mixes pads and teacher entries"


@rule("value")
def teacher_rows_sit_on_generated_tokens(view: SequenceView) -> str | None:
    if view.teacher_ids is None:
        return None
    bad = _first(_teacher_rows(view) & ~view.generated)
    return None if bad is None else f"distill row [{view.index}][{bad}] is a teacher row on a masked (not generated) position"


@rule("value")
def teacher_rows_are_log_probabilities(view: SequenceView) -> str | None:
    if view.teacher_ids is None:
        return None
    rows = _teacher_rows(view)
    ids, lps = view.teacher_ids, view.teacher_logprobs
    bad = _first(rows & ((ids < 0).any(axis=1) | ~np.isfinite(lps).all(axis=1) | (lps > 0).any(axis=1)))
    return None if bad is None else f"distill row [{view.index}][{bad}] has a negative id or a logprob that is not finite and <= 0"


@rule("value")
def teacher_rows_are_sorted(view: SequenceView) -> str | None:
    if view.teacher_ids is None:
        return None
    lps = view.teacher_logprobs
    bad = _first(_teacher_rows(view) & (lps[:, :-1] < lps[:, 1:]).any(axis=1))
    return None if bad is None else f"distill row [{view.index}][{bad}] is not sorted by logprob"


@rule("value")
def teacher_model_rows_cover_every_trained_token(view: SequenceView) -> str | None:
    """Where the group names the teacher kind that scored it (`group_overrides.teacher`: model, or
    a kind of yours), every generated (trained) token has a teacher row and the teacher's logprob
    of the sampled token: the OPD terms train on every token, a missing row would be silently
    skipped."""
    if view.taught_by is None:
        return None
    if view.teacher_ids is None:
        return f"sequence {view.index} has no distill rows, but group_overrides.teacher is {view.taught_by} (a row on every trained token)"
    bad = _first(view.generated & ~_teacher_rows(view))
    if bad is None:
        sampled = view.raw.get("teacher_logprobs")
        missing = view.generated & np.array([t is None for t in sampled], dtype=bool) if isinstance(sampled, list) and len(sampled) == view.generated.size else view.generated
        bad = _first(missing)
    return None if bad is None else f"trained token [{view.index}][{bad}] has no teacher row or teacher logprob, but group_overrides.teacher is {view.taught_by}"


def _teacher_rows(view: SequenceView) -> np.ndarray:
    """Rows that are not pads (a row that mixes pads counts as a teacher row)."""
    return ~(view.teacher_ids == DISTILL_PAD_ID).all(axis=1)


# ---- running the rules ----------------------------------------------------------------------

_SEQUENCE_FIELDS = ("tokens", "masks", "inference_logprobs", "distill_token_ids", "distill_logprobs")


def _problems(group: dict[str, Any]) -> Iterator[str]:
    """Every problem, in rule order; a broken group or shape rule stops what depends on it."""
    if not isinstance(group, dict):
        yield "a group must be a JSON object"
        return
    for r in RULES.values():
        if r.layer == "group" and (problem := r.check(group)):
            yield problem
            return
    for r in RULES.values():
        if r.layer == "field" and (problem := r.check(group)):
            yield problem
            break
    fields = [f for f in _SEQUENCE_FIELDS if group.get(f) is not None]
    taught = _taught_by(group)
    for i, score in enumerate(group["scores"]):
        view = SequenceView(i, score, {f: group[f][i] for f in fields}, taught_by=taught)
        if taught is not None:
            details = group.get("overrides")
            detail = details[i] if isinstance(details, list) and i < len(details) else None
            view.raw["teacher_logprobs"] = detail.get("teacher_logprobs") if isinstance(detail, dict) else None
        shaped = True
        for r in RULES.values():
            if r.layer == "shape" and (problem := r.check(view)):
                yield problem
                shaped = False
                break
        if not shaped:
            continue
        for r in RULES.values():
            if r.layer == "value" and (problem := r.check(view)):
                yield problem


def _taught_by(group: dict[str, Any]) -> str | None:
    """The teacher kind the group says scored every sampled token: `group_overrides.teacher`, any
    kind's name (the base environment writes it only where the kind's scorer scored every rollout;
    a label that is not a string is the field rules' problem, not a claim)."""
    label = group["group_overrides"].get("teacher") if isinstance(group.get("group_overrides"), dict) else None
    return label if isinstance(label, str) else None


def check_group(group: dict[str, Any]) -> list[str]:
    """Every problem with one group, as short sentences; an empty list means valid."""
    return list(_problems(group))


def is_valid(group: dict[str, Any]) -> bool:
    """True when `check_group` would find nothing; stops at the first problem."""
    return next(_problems(group), None) is None
