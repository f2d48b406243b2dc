"""Load math problems from the built-in generator, a local JSONL/Parquet file or the hub.

Every source yields rows `{"id", "problem", "answer"}` and the same deterministic held-out split.
Rows that cannot be used (missing text, non-numeric answer where only numbers are wanted) are
skipped, counted and logged once with a sample.
"""

from __future__ import annotations

import logging

from opd.config import ConfigError, DatasetConfig
from opd.data import math_builtin
from opd.data.sources import TaskSet, records
from opd.data.splits import train_eval_split
from opd.rewards.inline_math import is_plain_number

logger = logging.getLogger(__name__)

Row = dict[str, str]


def load_math(cfg: DatasetConfig) -> TaskSet:
    """Rows of the configured source, split into train and held-out eval by `cfg.split_seed`."""
    if cfg.source == "builtin":
        problems = math_builtin.generate(cfg.builtin_size)
        rows = [{"id": f"builtin-{i}", "problem": p["problem"], "answer": p["answer"]} for i, p in enumerate(problems)]
        train, held = train_eval_split(rows, cfg.eval_size, cfg.split_seed)
        return TaskSet(train, held, source=f"builtin:{cfg.builtin_size}")
    rows: list[Row] = []
    skipped, sample = 0, None
    for index, record in enumerate(records(cfg)):
        if cfg.max_rows is not None and len(rows) >= cfg.max_rows:
            break
        for key, column in (("dataset.prompt_field", cfg.prompt_field), ("dataset.answer_field", cfg.answer_field)):
            if column not in record:
                raise ConfigError(f"{key}: column {column!r} not in the dataset (columns: {sorted(record)})")
        problem, answer = record[cfg.prompt_field], record[cfg.answer_field]
        answer = "" if answer is None else str(answer).strip()
        if not isinstance(problem, str) or not problem.strip() or not answer or (cfg.numeric_answers_only and not is_plain_number(answer)):
            skipped += 1
            sample = sample or f"row {index}: answer={answer[:40]!r}"
            continue
        rows.append({"id": f"{cfg.name}-{index}", "problem": problem.strip(), "answer": answer})
    if skipped:
        logger.warning("dataset %s: skipped %d unusable rows (e.g. %s)", cfg.name, skipped, sample)
    if len(rows) <= cfg.eval_size:
        raise ConfigError(f"dataset.eval_size: {cfg.eval_size} held out of only {len(rows)} usable rows in {cfg.path}")
    train, held = train_eval_split(rows, cfg.eval_size, cfg.split_seed)
    return TaskSet(train, held, source=f"{cfg.source}:{cfg.path}", skipped=skipped)
