"""Load coding tasks: the built-in set, HumanEval from its package, a local file or the hub.

Every source yields tasks `{"id", "task", "test_code", ...}` with the same deterministic split.
Rows without a task or tests are skipped, counted and logged once.
"""

from __future__ import annotations

import logging

from opd.config import ConfigError, DatasetConfig
from opd.data import coding_tasks
from opd.data.sources import TaskSet, records
from opd.data.splits import train_eval_split

logger = logging.getLogger(__name__)


def load_coding(cfg: DatasetConfig) -> TaskSet:
    if cfg.source == "builtin":
        tasks, source = coding_tasks.builtin_tasks(), "builtin:coding"
    elif cfg.source == "humaneval":
        tasks, source = coding_tasks.humaneval_tasks(), "humaneval"
    else:
        tasks, source, skipped = [], f"{cfg.source}:{cfg.path}", 0
        for index, record in enumerate(records(cfg)):
            if cfg.max_rows is not None and len(tasks) >= cfg.max_rows:
                break
            for key, column in (("dataset.prompt_field", cfg.prompt_field), ("dataset.tests_field", cfg.tests_field)):
                if column not in record:
                    raise ConfigError(f"{key}: column {column!r} not in the dataset (columns: {sorted(record)})")
            task, tests = record[cfg.prompt_field], record[cfg.tests_field]
            if not isinstance(task, str) or not task.strip() or not isinstance(tests, str) or not tests.strip():
                skipped += 1
                continue
            tasks.append({"id": f"{cfg.name}-{index}", "task": task.strip(), "test_code": tests})
        if skipped:
            logger.warning("dataset %s: skipped %d rows without a task or tests", cfg.name, skipped)
    if cfg.max_rows is not None:
        tasks = tasks[: cfg.max_rows]
    if len(tasks) <= cfg.eval_size:
        raise ConfigError(f"dataset.eval_size: {cfg.eval_size} held out of only {len(tasks)} tasks in {source}")
    train, held = train_eval_split(tasks, cfg.eval_size, cfg.split_seed)
    return TaskSet(train, held, source=source)
