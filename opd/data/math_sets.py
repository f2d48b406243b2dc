"""Load math problems from the built-in generator, a local JSONL/Parquet file or the hub.

Every source yields rows `{"id", "problem", "answer"}` (the built-in set also `kind`) and the same
deterministic held-out split.
Rows that cannot be used (missing text, non-numeric answer where only numbers are wanted) are
skipped, counted and logged once with a sample.
"""

from __future__ import annotations

import re
from typing import Any

from opd.config import ConfigError, DatasetConfig
from opd.data import math_builtin
from opd.data.sources import TaskSet, mapped_rows, split

Row = dict[str, str]
_NUMBER = re.compile(r"[-+]?(\d+|\d{1,3}(,\d{3})+)(\.\d+)?")


def is_plain_number(answer: str) -> bool:
    """True for `42`, `-3`, `2.5`, `1,000`; False for `1,5`, `2+3`, `1/3`, `\\sqrt{2}` (dataset filter)."""
    return _NUMBER.fullmatch(answer.strip()) is not None


def load_math(cfg: DatasetConfig) -> TaskSet:
    """Rows of the configured source, split into train and held-out eval by `cfg.split_seed`."""
    if cfg.source == "builtin":
        try:
            problems = math_builtin.generate(cfg.builtin_size, kinds=cfg.kinds)
        except ValueError as err:
            raise ConfigError(f"dataset.kinds / dataset.builtin_size: {err}", "dataset.kinds") from None
        rows = [{"id": f"builtin-{i}", "problem": p["problem"], "answer": p["answer"], "kind": p["kind"]} for i, p in enumerate(problems)]
        source = f"builtin:{cfg.builtin_size}" + (f":{'+'.join(cfg.kinds)}" if cfg.kinds else "")
        return split(cfg, rows, source)

    def convert(index: int, record: dict[str, Any]) -> Row | None:
        problem, answer = record[cfg.prompt_field], record[cfg.answer_field]
        answer = "" if answer is None else str(answer).strip()
        if not isinstance(problem, str) or not problem.strip() or not answer or (cfg.numeric_answers_only and not is_plain_number(answer)):
            return None
        row: Row = {"id": f"{cfg.name}-{index}", "problem": problem.strip(), "answer": answer}
        kind = record.get("kind")  # a kind column: dataset.kinds selects by it, evaluation reports per kind
        if isinstance(kind, str) and kind.strip():
            row["kind"] = kind.strip()
        return row

    rows, skipped = mapped_rows(cfg, {"dataset.prompt_field": cfg.prompt_field, "dataset.answer_field": cfg.answer_field}, convert)
    return split(cfg, rows, f"{cfg.source}:{cfg.path}", skipped)
