"""Load coding tasks: the built-in set, HumanEval from its package, a local file or the hub.

Every source yields tasks `{"id", "task", "test_code", ...}` with the same deterministic split.
Rows without a task or tests are skipped, counted and logged once.
"""

from __future__ import annotations

from typing import Any

from opd.config import DatasetConfig
from opd.data import coding_builtin, humaneval
from opd.data.sources import TaskSet, mapped_rows, split


def load_coding(cfg: DatasetConfig) -> TaskSet:
    if cfg.source in ("builtin", "humaneval"):
        tasks = coding_builtin.builtin_tasks() if cfg.source == "builtin" else humaneval.humaneval_tasks()
        return split(cfg, tasks[: cfg.max_rows], "builtin:coding" if cfg.source == "builtin" else "humaneval")

    def convert(index: int, record: dict[str, Any]) -> dict[str, str] | None:
        task, tests = record[cfg.prompt_field], record[cfg.tests_field]
        if not isinstance(task, str) or not task.strip() or not isinstance(tests, str) or not tests.strip():
            return None
        return {"id": f"{cfg.name}-{index}", "task": task.strip(), "test_code": tests}

    rows, skipped = mapped_rows(cfg, {"dataset.prompt_field": cfg.prompt_field, "dataset.tests_field": cfg.tests_field}, convert)
    return split(cfg, rows, f"{cfg.source}:{cfg.path}", skipped)
