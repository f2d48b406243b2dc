"""Math datasets: the built-in set, local JSONL/Parquet with field mapping, clear errors."""

from __future__ import annotations

import json

import pytest

from conftest import compose
from opd.config import ConfigError, validate
from opd.data import math_builtin
from opd.data.math_sets import load_math


def dataset_cfg(overrides: list[str]):
    return validate(compose(overrides)).dataset


def test_builtin_set_is_deterministic_with_a_disjoint_held_out_split() -> None:
    first, second = load_math(dataset_cfg([])), load_math(dataset_cfg([]))
    assert first.train == second.train and first.eval == second.eval
    assert (len(first.train), len(first.eval)) == (360, 40)
    assert not {r["id"] for r in first.train} & {r["id"] for r in first.eval}
    for problem in math_builtin.generate(50):
        assert str(eval(problem["expression"], {"sum": sum, "range": range})) == problem["answer"]  # noqa: S307 - our own generator's text


def test_local_jsonl_with_field_mapping_skips_and_counts_bad_rows(tmp_path) -> None:
    path = tmp_path / "p.jsonl"
    rows = [{"question": f"What is {i} + 1?", "solution": i + 1} for i in range(30)]
    rows += [{"question": "no answer", "solution": None}, {"question": "", "solution": 3}, {"question": "sym", "solution": "2+3"}]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    cfg = dataset_cfg(["dataset=math_local", f"dataset.path={path}", "dataset.prompt_field=question", "dataset.answer_field=solution", "dataset.eval_size=5", "dataset.numeric_answers_only=true"])
    data = load_math(cfg)
    assert len(data.train) + len(data.eval) == 30 and len(data.eval) == 5 and data.skipped == 3
    assert {"id", "problem", "answer"} == set(data.train[0]) and data.train[0]["answer"].isdigit()


def test_local_parquet(tmp_path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"problem": [f"q{i}" for i in range(10)], "answer": [str(i) for i in range(10)]}), path)
    data = load_math(dataset_cfg(["dataset=math_local", f"dataset.path={path}", "dataset.eval_size=2"]))
    assert (len(data.train), len(data.eval)) == (8, 2)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["dataset=math_local", "dataset.path=/no/such/file.jsonl"], "dataset.path: no such file"),
        (["dataset=math_local", "dataset.path={tmp}/p.csv"], "dataset.path must end in one of"),
        (["dataset=math_local", "dataset.path={tmp}/p.jsonl", "dataset.prompt_field=nope"], "dataset.prompt_field: column 'nope' not in the dataset"),
        (["dataset=math_local", "dataset.path={tmp}/p.jsonl", "dataset.eval_size=50"], "dataset.eval_size: 50 held out of only 3"),
        (["dataset=acereason_math", "dataset.path=no-such-org/no-such-set"], "could not load hub dataset 'no-such-org/no-such-set'"),
    ],
)
def test_bad_sources_fail_with_the_key_named(tmp_path, monkeypatch, overrides: list[str], message: str) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps({"problem": f"q{i}", "answer": "1"}) for i in range(3)))
    (tmp_path / "p.csv").write_text("problem,answer\n")
    with pytest.raises(ConfigError) as info:
        load_math(dataset_cfg([o.format(tmp=tmp_path) for o in overrides]))
    assert message in str(info.value)
