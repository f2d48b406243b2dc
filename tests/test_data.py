"""Math datasets: the built-in set, local JSONL/Parquet with field mapping, clear errors."""

from __future__ import annotations

import json

import pytest

from conftest import compose
from opd.config import ConfigError, validate
from opd.data import math_builtin
from opd.data.coding_sets import load_coding
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


def test_kinds_select_the_builtin_generators_and_filter_any_set_with_kinds() -> None:
    data = load_math(dataset_cfg(["dataset.kinds=[digit_count,parity]"]))
    assert (len(data.train), len(data.eval)) == (360, 40) and data.source == "builtin:400:digit_count+parity"
    assert {r["kind"] for r in data.train + data.eval} == {"digit_count", "parity"}
    coding = load_coding(dataset_cfg(["env=opd_coding", "dataset.kinds=[reference]", "dataset.eval_size=1"]))
    assert {t["kind"] for t in coding.train + coding.eval} == {"reference"}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["dataset.kinds=[digit_count,cube]"], "problem kinds ['cube'] are not the generator's"),
        (["dataset.kinds=[parity]", "dataset.builtin_size=2000"], "only 990 distinct problems of kinds ['parity'], 2000 asked for"),
        (["env=opd_coding", "dataset.kinds=[parity]"], "dataset.kinds: ['parity'] not in"),
    ],
)
def test_bad_kinds_fail_with_the_key_named(overrides: list[str], message: str) -> None:
    cfg = dataset_cfg(overrides)
    with pytest.raises(ConfigError) as info:
        (load_coding if "env=opd_coding" in overrides else load_math)(cfg)
    assert message in str(info.value) and info.value.key == "dataset.kinds"


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


def test_a_local_file_with_a_kind_column_is_selected_by_kind(tmp_path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps({"problem": f"q{i}", "answer": str(i), "kind": "even" if i % 2 == 0 else "odd"}) for i in range(12)))
    data = load_math(dataset_cfg(["dataset=math_local", f"dataset.path={path}", "dataset.eval_size=2", "dataset.kinds=[odd]"]))
    rows = data.train + data.eval
    assert len(rows) == 6 and {r["kind"] for r in rows} == {"odd"} and all(int(r["answer"]) % 2 == 1 for r in rows)
    with pytest.raises(ConfigError, match=r"dataset.kinds: \['prime'\] not in"):
        load_math(dataset_cfg(["dataset=math_local", f"dataset.path={path}", "dataset.kinds=[prime]"]))


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


def run_tests(task: dict, solution: str) -> str:
    """The terminal output of the task's tests on `solution` in a fresh sandbox."""
    return run_all([(task, solution)])[0]


def run_all(cases: list[tuple[dict, str]], at_once: int = 4) -> list[str]:
    """`run_tests` for each (task, solution), `at_once` sandboxes at a time."""
    import asyncio

    from conftest import sandbox_limits
    from opd.tools.workspace import Workspace

    limits = sandbox_limits(timeout_s=20)

    async def one(task: dict, solution: str, slots: asyncio.Semaphore) -> str:
        async with slots:
            workspace = Workspace(limits)
            try:
                workspace.write_file("solution.py", solution)
                workspace.write_file("t.py", task["test_code"])
                return await workspace.terminal("python t.py")
            finally:
                await workspace.close()

    async def main() -> list[str]:
        slots = asyncio.Semaphore(at_once)
        return await asyncio.gather(*(one(task, solution, slots) for task, solution in cases))

    return asyncio.run(main())


@pytest.mark.slow
def test_builtin_coding_builtin_are_solvable_and_their_tests_bite() -> None:
    from opd.data.coding_sets import load_coding

    data = load_coding(dataset_cfg(["env=opd_coding"]))
    assert (len(data.train), len(data.eval)) == (112, 16)
    tasks = data.train[:40] + data.eval
    solved = run_all([(task, task["solution"]) for task in tasks])
    wrong = run_all([(task, f"def {task['entry_point']}(*a):\n    return None\n") for task in tasks])
    for task, good, bad in zip(tasks, solved, wrong):
        assert good.endswith("[exit code 0]"), (task["id"], good[-500:])
        assert not bad.endswith("[exit code 0]"), task["id"]


def test_humaneval_comes_from_the_installed_package() -> None:
    from opd.data.coding_sets import load_coding

    data = load_coding(dataset_cfg(["env=opd_coding", "dataset=humaneval"]))
    tasks = data.train + data.eval
    assert len(tasks) == 164 and len(data.eval) == 20
    for task in sorted(tasks, key=lambda t: t["id"])[:5]:
        assert run_tests(task, task["solution"]).endswith("[exit code 0]"), task["id"]


def test_local_coding_builtin_with_field_mapping(tmp_path) -> None:
    from opd.data.coding_sets import load_coding

    path = tmp_path / "tasks.jsonl"
    rows = [{"prompt": f"task {i}", "tests": "from solution import f\nassert f()\n"} for i in range(6)] + [{"prompt": "", "tests": "x"}]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    data = load_coding(dataset_cfg(["env=opd_coding", "dataset=coding_local", f"dataset.path={path}", "dataset.prompt_field=prompt", "dataset.tests_field=tests", "dataset.eval_size=2"]))
    assert (len(data.train), len(data.eval)) == (4, 2) and data.train[0]["test_code"].startswith("from solution")
