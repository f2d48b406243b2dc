"""A record file as a dataset: one row per rollout, typed columns, as Parquet or JSON lines.

`python -m opd.records export <groups.jsonl | run dir> --format parquet|jsonl --out DIR` and the
run's `parquet` sink (`sinks: [..., parquet]`) both call `export_file`. The file is read with the
bounded reader (`opd.records.reader`) one line at a time and written in row groups, so neither
side holds more than one group and one row group; the output appears whole or not at all (written
under a hidden temporary name, put in place at the end: without `--force` by a link that refuses
an existing name, so a file made meanwhile is never replaced).

The columns (`SCHEMA`; docs/records.md says what each holds and how trainers map them): the
rollout's place (`group_id`, `group_index`, `rollout_index`), its task and provenance (`item_id`,
`env`, `model`, `weight_version`), its tokens split at the first sampled token (`prompt_ids`,
`completion_ids`, `completion_mask`), the per-completion-token rows (`sampler_logprobs`,
`teacher_logprobs` and `teacher_logprobs_mask`, `teacher_topk_ids`/`teacher_topk_logprobs` and
`teacher_topk_mask`), its reward (`score`, `advantage`, `finish`, `passed`), and what is left of
the record as JSON text (`details`, `messages`, `group_overrides`, `generation_params`), so that
nothing the record says is lost: `record_of_rows` rebuilds the group from its rows.

A line the reader refuses, a group that breaks the format's rules (`opd.records.rules`), a group
equal to an earlier one, or one holding something the rows cannot carry is skipped, and said:
`Exported.skipped` lists each as `line N: why`.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from opd.records.escape import console
from opd.records.format import DISTILL_PAD_ID, DISTILL_PAD_LOGPROB, MASK, MASKED_LOGPROB
from opd.records.reader import LIMITS, Limits, digest, is_gzip, records
from opd.records.rules import check_group
from opd.run_files import open_file, read_text, replacing
from opd.train.batch import group_advantages

logger = logging.getLogger(__name__)

FORMATS = ("parquet", "jsonl")
_IDS = pa.list_(pa.int32())
_FLAGS = pa.list_(pa.int8())
_FLOATS = pa.list_(pa.float32())
SCHEMA = pa.schema([
    ("group_id", pa.string()),
    ("group_index", pa.int64()),
    ("rollout_index", pa.int32()),
    ("item_id", pa.string()),
    ("env", pa.string()),
    ("model", pa.string()),
    ("weight_version", pa.int64()),
    ("prompt_ids", _IDS),
    ("completion_ids", _IDS),
    ("completion_mask", _FLAGS),
    ("sampler_logprobs", _FLOATS),
    ("teacher_logprobs", _FLOATS),
    ("teacher_logprobs_mask", _FLAGS),
    ("teacher_topk_ids", pa.list_(_IDS)),
    ("teacher_topk_logprobs", pa.list_(_FLOATS)),
    ("teacher_topk_mask", _FLAGS),
    ("score", pa.float64()),
    ("advantage", pa.float64()),
    ("finish", pa.string()),
    ("passed", pa.bool_()),
    ("details", pa.string()),
    ("messages", pa.string()),
    ("group_overrides", pa.string()),
    ("generation_params", pa.string()),
])
COLUMNS = tuple(SCHEMA.names)
# The group's keys the rows carry (per rollout, or as JSON text); any other key is named in a
# skip: a group is never exported with part of it left out silently.
_CARRIED = frozenset(("tokens", "masks", "inference_logprobs", "scores", "overrides", "messages", "distill_token_ids", "distill_logprobs",
                      "group_overrides", "generation_params"))
# Atropos's per-token `advantages` and `ref_logprobs`: the environments write them null (the
# trainer computes advantages from the scores: the `advantage` column), and null is what the rows
# give back; a group holding values in them is skipped, named.
_NULL_ONLY = ("advantages", "ref_logprobs")
# Values buffered before a row group is written (token ids, flags and logprobs of every row): a
# row group of ~4 M values is some 20-40 MB in memory, and `datasets` reads a file by row groups.
ROW_GROUP_VALUES = 1 << 22
# Skipped lines named in the log per file (the rest are counted).
MAX_SKIPS_SHOWN = 20


# What the typed columns hold: token ids as int32, logprobs as float32 (vLLM computes them in float32).
_INT32_MAX = 2**31 - 1
_FLOAT32_MAX = 3.4028234663852886e38


class ExportError(ValueError):
    """An export that cannot be made (no such file, nothing to export, the output is the input)."""


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def prompt_length(masks: list[int]) -> int:
    """Where the completion starts: the first position the policy sampled (`masks` is the token
    id there; every rollout of a valid group has one)."""
    return next((p for p, m in enumerate(masks) if m != MASK), len(masks))


def _fits(group: dict[str, Any]) -> str | None:
    """What in a valid group the typed columns cannot hold as it is, or None."""
    if extra := sorted(set(group) - _CARRIED - set(_NULL_ONLY)):
        return f"fields the export does not carry: {', '.join(extra[:5])}"
    if held := [key for key in _NULL_ONLY if group.get(key) is not None and any(row is not None for row in group[key])]:
        return f"per-token {' and '.join(held)} (not null), which the export does not carry"
    for key in ("tokens", "distill_token_ids"):
        rows = group.get(key) or []
        if any(max(map(max, seq)) > _INT32_MAX if seq and isinstance(seq[0], list) else max(seq) > _INT32_MAX for seq in rows):
            return f"{key} holds an id past int32"
    for key in ("inference_logprobs", "distill_logprobs"):
        rows = group.get(key) or []
        if any(min(map(min, seq)) < -_FLOAT32_MAX if seq and isinstance(seq[0], list) else min(seq) < -_FLOAT32_MAX for seq in rows):
            return f"{key} holds a logprob past float32's range"
    for i, detail in enumerate(group.get("overrides") or []):
        if any(t is not None and abs(t) > _FLOAT32_MAX for t in (detail or {}).get("teacher_logprobs") or []):
            return f"overrides[{i}].teacher_logprobs holds a logprob past float32's range"
    return None


def rows_of_group(group: dict[str, Any], group_index: int, model: str | None = None) -> list[dict[str, Any]]:
    """One row per rollout of a valid group (`opd.records.rules`), columns as in `SCHEMA`, numbers
    as the record holds them. ValueError when the group holds something the rows cannot carry: a
    key the format does not name, an id past int32 or a logprob past float32, a teacher logprob on
    a prompt position."""
    if (problem := _fits(group)) is not None:
        raise ValueError(problem)
    scores = [float(s) for s in group["scores"]]
    advantages = group_advantages(scores)
    meta = group.get("group_overrides") or {}
    item = meta.get("item_id")
    common = {
        "group_id": digest(group).hex(),
        "group_index": group_index,
        "item_id": None if item is None else str(item),
        "env": meta.get("env"),
        "model": model,
        "weight_version": meta.get("weight_version"),
        "group_overrides": _json(group.get("group_overrides")),
        "generation_params": _json(group.get("generation_params")),
    }
    details = group.get("overrides") or [None] * len(scores)
    messages = group.get("messages") or [None] * len(scores)
    sampler, topk_ids, topk_lps = group.get("inference_logprobs"), group.get("distill_token_ids"), group.get("distill_logprobs")
    rows = []
    for i, (tokens, masks) in enumerate(zip(group["tokens"], group["masks"])):
        start = prompt_length(masks)
        completion = masks[start:]
        detail = details[i] if isinstance(details[i], dict) else None
        rest = None if detail is None else {k: v for k, v in detail.items() if k != "teacher_logprobs"}
        teacher = detail.get("teacher_logprobs") if detail is not None else None
        if teacher is not None and any(t is not None for t in teacher[:start]):
            raise ValueError(f"overrides[{i}].teacher_logprobs has a value on a prompt position (before the first sampled token, {start})")
        row = {
            **common,
            "rollout_index": i,
            "prompt_ids": tokens[:start],
            "completion_ids": tokens[start:],
            "completion_mask": [0 if m == MASK else 1 for m in completion],
            "sampler_logprobs": None if sampler is None else [0.0 if m == MASK else lp for m, lp in zip(completion, sampler[i][start:])],
            "teacher_logprobs": None if teacher is None else [0.0 if t is None else t for t in teacher[start:]],
            "teacher_logprobs_mask": None if teacher is None else [0 if t is None else 1 for t in teacher[start:]],
            "teacher_topk_ids": None if topk_ids is None else topk_ids[i][start:],
            "teacher_topk_logprobs": None if topk_lps is None else topk_lps[i][start:],
            "teacher_topk_mask": None if topk_ids is None else [0 if r[0] == DISTILL_PAD_ID else 1 for r in topk_ids[i][start:]],
            "score": scores[i],
            "advantage": advantages[i],
            "finish": detail.get("finish") if detail is not None else None,
            "passed": detail.get("passed") if detail is not None else None,
            "details": _json(rest),
            "messages": _json(messages[i]),
        }
        rows.append({name: row[name] for name in COLUMNS})
    return rows


def record_of_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The group that `rows` (one group's, in rollout order, read back from either format) came
    from: the inverse of `rows_of_group` (Parquet's float32 columns give float32 values back)."""
    first = rows[0]
    group: dict[str, Any] = {"tokens": [], "masks": [], "scores": [], **dict.fromkeys(_NULL_ONLY)}
    sampled = first["sampler_logprobs"] is not None
    topk = first["teacher_topk_ids"] is not None
    if sampled:
        group["inference_logprobs"] = []
    if topk:
        group["distill_token_ids"], group["distill_logprobs"] = [], []
    details, messages = [], []
    for row in rows:
        prompt, completion, flags = list(row["prompt_ids"]), list(row["completion_ids"]), list(row["completion_mask"])
        group["tokens"].append(prompt + completion)
        group["masks"].append([MASK] * len(prompt) + [t if f else MASK for t, f in zip(completion, flags)])
        group["scores"].append(row["score"])
        if sampled:
            group["inference_logprobs"].append([MASKED_LOGPROB] * len(prompt) + [lp if f else MASKED_LOGPROB for lp, f in zip(row["sampler_logprobs"], flags)])
        if topk:
            k = len(row["teacher_topk_ids"][0]) if row["teacher_topk_ids"] else 0
            group["distill_token_ids"].append([[DISTILL_PAD_ID] * k] * len(prompt) + [list(r) for r in row["teacher_topk_ids"]])
            group["distill_logprobs"].append([[DISTILL_PAD_LOGPROB] * k] * len(prompt) + [list(r) for r in row["teacher_topk_logprobs"]])
        detail = None if row["details"] is None else json.loads(row["details"])
        if row["teacher_logprobs"] is not None:
            detail = detail if detail is not None else {}
            detail["teacher_logprobs"] = [None] * len(prompt) + [t if f else None for t, f in zip(row["teacher_logprobs"], row["teacher_logprobs_mask"])]
        details.append(detail)
        messages.append(None if row["messages"] is None else json.loads(row["messages"]))
    if any(d is not None for d in details):
        group["overrides"] = details
    if any(m is not None for m in messages):
        group["messages"] = messages
    for key in ("group_overrides", "generation_params"):
        if first[key] is not None:
            group[key] = json.loads(first[key])
    return group


@dataclass
class Exported:
    """What an export wrote: the file (None: nothing written), groups and rows, and the lines
    skipped (`line N: why`)."""

    path: Path | None
    groups: int = 0
    rows: int = 0
    skipped: list[str] = field(default_factory=list)


def _groups(handle: IO[bytes], gzipped: bool, limits: Limits, skipped: list[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, group) of each valid group the record file `handle` holds, each once; every
    other line appended to `skipped`."""
    seen: dict[bytes, int] = {}
    for record in records(handle, gzipped, limits):
        if record.problem is not None:
            skipped.append(f"line {record.number}: {console(record.problem)}")
            if record.fatal:
                return
            continue
        if record.blank:
            continue
        if problems := check_group(record.value):
            skipped.append(f"line {record.number}: {console(problems[0])}" + (f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""))
            continue
        fingerprint = digest(record.value)
        if fingerprint in seen:
            skipped.append(f"line {record.number}: a duplicate of the group on line {seen[fingerprint]}")
            continue
        seen[fingerprint] = record.number
        yield record.number, record.value


def _size(row: dict[str, Any]) -> int:
    """Values in a row's lists, roughly (what a row group buffers)."""
    k = len(row["teacher_topk_ids"][0]) if row["teacher_topk_ids"] else 0
    return (len(row["prompt_ids"]) + len(row["completion_ids"])) * (4 + 2 * k)


def table_of_rows(rows: list[dict[str, Any]]) -> pa.Table:
    """One group's rows as columns of `SCHEMA`; ValueError naming what a column cannot hold (so
    that such a group is skipped, said, in either format, and never fails the file's other groups)."""
    try:
        return pa.Table.from_pylist(rows, schema=SCHEMA)
    except (pa.ArrowException, OverflowError, TypeError, ValueError) as err:
        raise ValueError(f"a value the typed columns cannot hold: {err}") from err


class _Parquet:
    def __init__(self, out: IO[bytes]) -> None:
        self.writer = pq.ParquetWriter(out, SCHEMA)
        self.tables: list[pa.Table] = []
        self.values = 0

    def write(self, rows: list[dict[str, Any]]) -> None:
        self.tables.append(table_of_rows(rows))
        self.values += sum(map(_size, rows))
        if self.values >= ROW_GROUP_VALUES:
            self.flush()

    def flush(self) -> None:
        if self.tables:
            self.writer.write_table(pa.concat_tables(self.tables))
            self.tables, self.values = [], 0

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self.writer.close()


class _Jsonl:
    def __init__(self, out: IO[bytes]) -> None:
        self.out = out

    def write(self, rows: list[dict[str, Any]]) -> None:
        table_of_rows(rows)  # the same rows as Parquet's: a group its columns cannot hold is skipped here too
        for row in rows:
            self.out.write(json.dumps(row, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8") + b"\n")

    def close(self) -> None:
        pass


def groups_file(source: Path) -> Path:
    """The record file a path names: itself, or a run directory's groups.jsonl (or .jsonl.gz). A
    name present as a link, dangling or not, is the one the directory names (and the reader
    refuses it): a broken groups.jsonl is never passed over for a groups.jsonl.gz beside it."""
    if not source.is_dir():
        return source
    for name in ("groups.jsonl", "groups.jsonl.gz"):
        if os.path.lexists(source / name):
            return source / name
    raise ExportError(f"{console(str(source))}: a directory without groups.jsonl (or groups.jsonl.gz): not a run directory")


def run_model(source: Path) -> str | None:
    """`server.model` of the run that wrote `source` (its config.yaml beside it), or None."""
    import yaml

    config = source.parent / "config.yaml"
    if not config.exists():
        return None
    try:
        model = (yaml.safe_load(read_text(config)) or {}).get("server", {}).get("model")
    except (OSError, ValueError, AttributeError, yaml.YAMLError) as err:
        logger.warning("%s: cannot read the run's model from it (%s); the model column is null", console(str(config)), console(str(err)))
        return None
    return model if isinstance(model, str) else None


def output_name(source: Path, fmt: str) -> str:
    """The file an export of `source` writes: groups.jsonl(.gz) -> groups.parquet, or
    groups.rows.jsonl for JSON lines (never a name `groups_file` takes for records). Never hidden:
    `datasets` skips hidden files."""
    stem = source.name.removesuffix(".gz").removesuffix(".jsonl").lstrip(".") or "groups"
    return f"{stem}.parquet" if fmt == "parquet" else f"{stem}.rows.jsonl"


def export_file(source: Path, out_dir: Path, fmt: str = "parquet", model: str | None = None, limits: Limits = LIMITS,
                follow: bool = False, replace: bool = False) -> Exported:
    """Write `<out_dir>/<output_name>` (groups.jsonl -> groups.parquet) from the record file
    `source`, one row per rollout (see the module docstring). `model`: the model column (None:
    null). `follow`: follow a symbolic link `source` names (one the user named). `replace`: write
    over an existing output file (never over `source`); without it an existing one is refused.
    Nothing is written when no group could be exported (ExportError)."""
    if fmt not in FORMATS:
        raise ExportError(f"format {fmt!r}: one of {', '.join(FORMATS)}")
    try:
        handle = open_file(source, "rb", follow=follow)
    except OSError as err:
        raise ExportError(f"{console(str(source))}: cannot read it: {console(err.strerror or str(err))}") from err
    with handle:
        return _export(handle, source, out_dir, fmt, model, limits, replace)


def _export(handle: IO[bytes], source: Path, out_dir: Path, fmt: str, model: str | None, limits: Limits, replace: bool) -> Exported:
    target = out_dir / output_name(source, fmt)
    if os.path.lexists(target):
        if target.exists() and os.path.samefile(target, source):
            raise ExportError(f"{console(str(target))} is the record file itself: choose another --out")
        if not replace:
            raise ExportError(f"{console(str(target))} exists: choose another --out, or --force to replace it")
    made = _make_dirs(out_dir)
    result = Exported(None)
    try:
        _write(handle, source, target, fmt, model, limits, result, replace)
    except BaseException as err:
        _remove_dirs(made)
        if isinstance(err, FileExistsError) and not replace and os.path.lexists(target):
            raise ExportError(f"{console(str(target))} exists (made while the export ran): choose another --out, or --force to replace it") from None
        raise
    result.path = target
    if others := sorted(p.name for p in out_dir.iterdir() if p != target and not p.name.startswith((".", "_")) and p.is_file()):
        logger.warning("%s also holds %s: datasets.load_dataset(%r, data_dir=...) reads every file in it", console(str(out_dir)),
                       console(", ".join(others[:3]) + (", ..." if len(others) > 3 else "")), fmt if fmt == "parquet" else "json")
    return result


def _make_dirs(out_dir: Path) -> list[Path]:
    """Make `out_dir` and its missing parents; the directories made here, outermost first (one
    made meanwhile by someone else is not among them). ExportError when `out_dir` is there but no
    directory."""
    missing: list[Path] = []
    path = out_dir
    while not os.path.lexists(path) and path != path.parent:
        missing.append(path)
        path = path.parent
    made: list[Path] = []
    try:
        for path in reversed(missing):
            try:
                os.mkdir(path)
            except FileExistsError:
                continue
            made.append(path)
        if not out_dir.is_dir():
            raise ExportError(f"{console(str(out_dir))} is not a directory: choose another --out")
    except BaseException:
        _remove_dirs(made)
        raise
    return made


def _remove_dirs(made: list[Path]) -> None:
    """Remove the directories `_make_dirs` made, deepest first; one that is not empty (someone
    wrote in it meanwhile) is left, and so are those above it."""
    for path in reversed(made):
        try:
            os.rmdir(path)
        except OSError:
            return


def _write(handle: IO[bytes], source: Path, target: Path, fmt: str, model: str | None, limits: Limits, result: Exported,
           replace: bool) -> None:
    with replacing(target, replace=replace) as out:  # without replace, never over a file there, not even one made meanwhile
        writer = _Parquet(out) if fmt == "parquet" else _Jsonl(out)
        try:
            for number, group in _groups(handle, is_gzip(source), limits, result.skipped):
                try:
                    rows = rows_of_group(group, result.groups, model)
                    writer.write(rows)  # a group the columns (or JSON) cannot hold is refused whole, before a byte of it is written
                except ValueError as err:
                    result.skipped.append(f"line {number}: {console(str(err))}")
                    continue
                result.groups += 1
                result.rows += len(rows)
        finally:
            writer.close()
        if not result.groups:
            raise ExportError(f"{console(str(source))}: no group to export" + (f" ({len(result.skipped)} lines skipped: {result.skipped[0]})" if result.skipped else ""))


def log_skips(source: Path, skipped: list[str]) -> None:
    shown = console(str(source))
    for line in skipped[:MAX_SKIPS_SHOWN]:
        logger.error("%s: %s: skipped", shown, line)
    if len(skipped) > MAX_SKIPS_SHOWN:
        logger.error("%s: ... and %d more lines skipped", shown, len(skipped) - MAX_SKIPS_SHOWN)

