"""What every dataset loader shares: the train/eval result and reading local files or the hub."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opd.config import ConfigError, DatasetConfig

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
