"""The dataset's schema (conf/dataset/): where the tasks come from and how they are split."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from omegaconf import MISSING

from opd.config.checks import at_least, checked, join, nonempty, one_of, relation, require


@dataclass
class DatasetConfig:
    """The tasks (conf/dataset/base.yaml documents each field)."""

    name: str = MISSING
    source: str = checked(one_of("builtin", "local", "hub", "humaneval"))
    path: Optional[str] = MISSING
    subset: Optional[str] = MISSING
    split: str = MISSING
    streaming: bool = MISSING
    prompt_field: str = MISSING
    answer_field: str = MISSING
    tests_field: str = MISSING
    numeric_answers_only: bool = MISSING
    max_rows: Optional[int] = checked(at_least(1), null="all rows")
    eval_size: int = checked(at_least(0))
    split_seed: int = MISSING
    builtin_size: int = checked(at_least(2))
    kinds: Optional[list[str]] = checked(nonempty("a non-empty list of kinds"), null="all kinds")


@relation(DatasetConfig)
def path_of_a_file_source(dataset: DatasetConfig, at: str) -> None:
    if dataset.source in ("local", "hub"):
        require(bool(dataset.path), join(at, "path"), f"set when {join(at, 'source')}={dataset.source}", dataset.path)
