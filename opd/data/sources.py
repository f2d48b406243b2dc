"""What every dataset loader shares: reading local files or the hub into rows, and the train/eval
split with its checks."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
import logging
from typing import Any, Callable

from opd.config import ConfigError, DatasetConfig
from opd.data.splits import train_eval_split

logger = logging.getLogger(__name__)

_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


@dataclass
class TaskSet:
    """Items for training and the held-out evaluation split, plus where they came from."""

    train: list[dict[str, Any]]
    eval: list[dict[str, Any]]
    source: str
    skipped: int = 0


def records(cfg: DatasetConfig):
    """Iterate raw records of a local file or hub dataset (lazy for streamed hub sets)."""
    import datasets

    if cfg.source == "local":
        path = Path(cfg.path or "")
        if not path.is_file():
            raise ConfigError(f"dataset.path: no such file: {path}")
        fmt = _FORMATS.get(path.suffix.lower())
        if fmt is None:
            raise ConfigError(f"dataset.path must end in one of {sorted(_FORMATS)}, got {path.name}")
        return datasets.load_dataset(fmt, data_files=str(path), split="train")
    try:
        return datasets.load_dataset(cfg.path, cfg.subset, split=cfg.split, streaming=cfg.streaming)
    except Exception as err:  # datasets raises many types for offline / missing / gated sets
        raise ConfigError(
            f"dataset.path: could not load hub dataset {cfg.path!r} (split {cfg.split!r}): "
            f"{type(err).__name__}: {str(err)[:300]}. Offline? Use a local file (dataset.source=local) or the env's built-in set (dataset.source=builtin)."
        ) from None


def mapped_rows(cfg: DatasetConfig, columns: dict[str, str], convert: Callable[[int, dict[str, Any]], dict[str, Any] | None]) -> tuple[list[dict[str, Any]], int]:
    """(rows, skipped) from a local file or hub set: the `columns` ({config key: column name})
    must exist; `convert(index, record)` makes a row or returns None for an unusable record, which
    is skipped, counted and logged once with a sample. Stops at `dataset.max_rows` rows."""
    rows: list[dict[str, Any]] = []
    skipped, sample = 0, None
    for index, record in enumerate(records(cfg)):
        if cfg.max_rows is not None and len(rows) >= cfg.max_rows:
            break
        for key, column in columns.items():
            if column not in record:
                raise ConfigError(f"{key}: column {column!r} not in the dataset (columns: {sorted(record)})", key)
        row = convert(index, record)
        if row is None:
            skipped += 1
            sample = sample or f"row {index}: {str({c: record[c] for c in columns.values()})[:120]}"
            continue
        rows.append(row)
    if skipped:
        logger.warning("dataset %s: skipped %d unusable rows (e.g. %s)", cfg.name, skipped, sample)
    return rows, skipped


def split(cfg: DatasetConfig, rows: list[dict[str, Any]], source: str, skipped: int = 0) -> TaskSet:
    """Keep the rows of `dataset.kinds` (if set), then hold out `dataset.eval_size` rows (chosen by
    `dataset.split_seed`); the rest train."""
    if cfg.kinds is not None:
        present = sorted({str(row["kind"]) for row in rows if "kind" in row})
        if not present:
            raise ConfigError(f"dataset.kinds: {source} has no problem kinds to select from", "dataset.kinds")
        unknown = sorted(set(cfg.kinds) - set(present))
        if unknown:
            raise ConfigError(f"dataset.kinds: {unknown} not in {source} (its kinds: {present})", "dataset.kinds")
        rows = [row for row in rows if row.get("kind") in cfg.kinds]
    if len(rows) <= cfg.eval_size:
        raise ConfigError(f"dataset.eval_size: {cfg.eval_size} held out of only {len(rows)} usable rows in {source}", "dataset.eval_size")
    train, held = train_eval_split(rows, cfg.eval_size, cfg.split_seed)
    return TaskSet(train, held, source=source, skipped=skipped)
