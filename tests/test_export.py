"""`python -m opd.records export`: a run's records as a dataset, one row per rollout.

The records are the project's own: an OPD coding group (teacher logprobs and top-K rows on a
hinted turn) and an inline-math group of two rollouts, made by the environments over the scripted
server and written by the run's writer into a run directory beside its config.yaml."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import datasets
import pytest

from conftest import ROOT, compose
from opd.config import validate
from opd.data.sources import TaskSet
from opd.records import export
from opd.records import DISTILL_PAD_ID, DISTILL_PAD_LOGPROB, MASK, GroupWriter, check_group
from opd.records.__main__ import main
from opd.serving.vllm_client import Generation, PromptScores
from opd.train.batch import group_advantages
from scripted import ScriptedClient, build_env, text_generator

# One worker builds the records (the coding rollout runs its tests in the sandbox twice).
pytestmark = pytest.mark.xdist_group("export")
MODEL = "Qwen/Qwen3-0.6B"
CODING_TASK = {
    "id": "t-add3",
    "task": "Write a Python function `add_3(x)` that returns `x` plus 3.",
    "test_code": "from solution import add_3\nassert add_3(1) == 4\nassert add_3(-3) == 0\nprint('All tests passed!')\n",
}


def coding_group(fixture_model: str, tokenizer) -> dict[str, Any]:
    """opd_coding, one rollout: a wrong solution, its failing test (the judge hints), the fix."""
    from opd.agent.tool_calls import tool_call_text

    turns = [tool_call_text("write_file", {"path": "solution.py", "content": "def add_3(x):\n    return x + 4\n"}),
             tool_call_text("terminal", {"command": "python test_solution.py"}),
             tool_call_text("write_file", {"path": "solution.py", "content": "def add_3(x):\n    return x + 3\n"}), "Fixed."]

    def generate(prompt_ids, *, max_tokens, stop=None) -> Generation:
        ids = tokenizer.encode(turns.pop(0) + "<|im_end|>", add_special_tokens=False)
        return Generation(ids, [-0.5] * len(ids), "stop")

    def chat(messages, n) -> list[str]:
        hinted = "AssertionError" in messages[-1]["content"]
        return ["\\boxed{1}\n[HINT_START]Return x + 3, not x + 4.[HINT_END]" if hinted else "\\boxed{-1}"] * n

    def score(ids, k) -> PromptScores:
        rows = [[(t + j) % 4000 for j in range(k)] for t in ids]
        lps = [[-0.25 * (j + 1) for j in range(k)] for _ in ids]
        return PromptScores([[]] + rows[1:], [[]] + lps[1:], [None] + [-0.125] * (len(ids) - 1))

    client = ScriptedClient(generate=generate, chat=chat, score=score)
    cfg = validate(compose(["env=opd_coding", "group_size=1", "distill_topk=4", "judge_votes=1"]))
    env = build_env(cfg, TaskSet(train=[CODING_TASK], eval=[], source="test"), fixture_model, client, max_attempts=1)
    group, _ = asyncio.run(env.collect_trajectories(CODING_TASK))
    return group


def math_group(fixture_model: str, tokenizer) -> dict[str, Any]:
    """inline_math, two rollouts: one calls the calculator and answers right, one answers wrong."""
    call = '<think>\n<tool_call>\n{"name": "calculator", "arguments": {"expr": "2 + 3"}}\n</tool_call>'
    script = [(call, "stop"), ("It is 5.\n</think>\n\n\\boxed{5}<|im_end|>", "stop")]
    wrong = [("<think>\nSurely 6.\n</think>\n\n\\boxed{6}<|im_end|>", "stop")]
    client = ScriptedClient(generate=text_generator(tokenizer, script + wrong, logprob=-0.75))
    cfg = validate(compose(["group_size=1"]))
    env = build_env(cfg, TaskSet(train=[{"id": "t0", "problem": "What is 2 + 3?", "answer": "5"}], eval=[], source="test"), fixture_model, client)
    first, _ = asyncio.run(env.collect_trajectories(asyncio.run(env.get_next_item())))
    second, _ = asyncio.run(env.collect_trajectories(asyncio.run(env.get_next_item())))
    # One group of the two rollouts (group_size=2 would interleave the script's turns).
    group = {key: first[key] + second[key] if isinstance(first[key], list) else first[key] for key in first}
    return group


@pytest.fixture(scope="module")
def run_dir(fixture_model: str, tokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("run")
    groups = [coding_group(fixture_model, tokenizer), math_group(fixture_model, tokenizer)]
    for group in groups:
        assert check_group(group) == []
    with GroupWriter(run / "groups.jsonl") as writer:
        for group in groups:
            writer.write(group)
    (run / "config.yaml").write_text(f"server:\n  model: {MODEL}\n")
    return run


def recorded(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "groups.jsonl").read_text().splitlines()]


def by_group(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        out.setdefault(row["group_index"], []).append(row)
    return [sorted(out[g], key=lambda r: r["rollout_index"]) for g in sorted(out)]


def test_a_runs_records_load_with_datasets_one_typed_row_per_rollout(run_dir: Path, tmp_path: Path) -> None:
    from opd.records.export import record_of_rows

    out = tmp_path / "dataset"
    assert main(["export", str(run_dir), "--format", "parquet", "--out", str(out)]) == 0
    assert [p.name for p in out.iterdir()] == ["groups.parquet"]
    data = datasets.load_dataset("parquet", data_dir=str(out), split="train")
    groups = recorded(run_dir)
    assert len(data) == sum(len(g["tokens"]) for g in groups) == 3
    for column in ("prompt_ids", "completion_ids"):
        assert data.features[column].feature.dtype == "int32"
    assert data.features["teacher_topk_ids"].feature.feature.dtype == "int32"
    assert data.features["completion_mask"].feature.dtype == "int8"
    rows = by_group(data.to_list())
    assert len(rows) == 2
    coding, math = groups
    for group, group_rows in zip(groups, rows):
        advantages = group_advantages(group["scores"])
        for i, row in enumerate(group_rows):
            tokens, masks = group["tokens"][i], group["masks"][i]
            start = next(p for p, m in enumerate(masks) if m != MASK)
            assert row["prompt_ids"] == tokens[:start] and row["prompt_ids"] + row["completion_ids"] == tokens
            assert row["completion_mask"] == [int(m != MASK) for m in masks[start:]]
            assert row["completion_mask"][0] == 1 and (i > 0 or 0 in row["completion_mask"])  # tool results inside a completion are masked
            assert row["score"] == group["scores"][i] and row["advantage"] == pytest.approx(advantages[i])
            assert row["sampler_logprobs"] == [lp if m != MASK else 0.0 for m, lp in zip(masks[start:], group["inference_logprobs"][i][start:])]
            assert row["model"] == MODEL and row["env"] == group["group_overrides"]["env"] and row["item_id"] == group["group_overrides"]["item_id"]
            assert row["group_id"] == group_rows[0]["group_id"]
    assert rows[0][0]["group_id"] != rows[1][0]["group_id"]
    # The math rollouts: one right, one wrong, so opposite advantages; no teacher columns.
    assert [r["passed"] for r in rows[1]] == [True, False] and rows[1][0]["advantage"] > 0 > rows[1][1]["advantage"]
    assert all(r[c] is None for r in rows[1] for c in ("teacher_logprobs", "teacher_logprobs_mask", "teacher_topk_ids", "teacher_topk_mask"))
    # The coding rollout: teacher rows on the hinted turn only, pads explicit elsewhere.
    (row,) = rows[0]
    start = len(row["prompt_ids"])
    teacher = coding["overrides"][0]["teacher_logprobs"][start:]
    assert row["teacher_logprobs_mask"] == [int(t is not None) for t in teacher] and 0 < sum(row["teacher_logprobs_mask"]) < len(teacher)
    assert row["teacher_logprobs"] == [-0.125 if t is not None else 0.0 for t in teacher]
    assert row["teacher_topk_mask"] == row["teacher_logprobs_mask"]
    assert row["teacher_topk_ids"] == coding["distill_token_ids"][0][start:]
    for flag, ids, lps in zip(row["teacher_topk_mask"], row["teacher_topk_ids"], row["teacher_topk_logprobs"]):
        assert len(ids) == len(lps) == 4
        assert (ids, lps) == (([DISTILL_PAD_ID] * 4, [DISTILL_PAD_LOGPROB] * 4) if not flag else (ids, [-0.25, -0.5, -0.75, -1.0]))
    # Nothing lost: each group comes back from its rows (float32 columns: the values above are exact in it).
    for group, group_rows in zip(groups, rows):
        rebuilt = record_of_rows(group_rows)
        assert check_group(rebuilt) == []
        assert rebuilt == group


def test_jsonl_holds_the_same_rows(run_dir: Path, tmp_path: Path) -> None:
    assert main(["export", str(run_dir / "groups.jsonl"), "--format", "jsonl", "--out", str(tmp_path / "rows")]) == 0
    data = datasets.load_dataset("json", data_dir=str(tmp_path / "rows"), split="train")
    parquet = tmp_path / "parquet"
    assert main(["export", str(run_dir), "--out", str(parquet)]) == 0
    assert data.to_list() == datasets.load_dataset("parquet", data_dir=str(parquet), split="train").to_list()


def test_bad_input_is_named_and_good_groups_are_kept(run_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # No such file, a directory that is no run: exit 1, the path named, nothing written.
    assert main(["export", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "a")]) == 1
    assert "missing.jsonl" in caplog.text and "No such file" in caplog.text and not (tmp_path / "a").exists()
    caplog.clear()
    assert main(["export", str(tmp_path), "--out", str(tmp_path / "b")]) == 1
    assert "without groups.jsonl" in caplog.text and not (tmp_path / "b").exists()
    # A file with a cut line, a broken group and a duplicate between good ones: each skipped line
    # named, the good groups written, exit 1.
    good = (run_dir / "groups.jsonl").read_text().splitlines()
    broken = json.loads(good[1])
    broken["masks"][0] = broken["masks"][0][:-1]
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("\n".join([good[0], '{"tokens": [[1, 2', json.dumps(broken), good[1], good[0]]) + "\n")
    caplog.clear()
    assert main(["export", str(mixed), "--out", str(tmp_path / "c")]) == 1
    assert re.search(r"mixed\.jsonl: line 2: .*skipped", caplog.text) and re.search(r"line 3: .*masks.*skipped", caplog.text)
    assert "line 5: a duplicate of the group on line 1" in caplog.text
    assert len(datasets.load_dataset("parquet", data_dir=str(tmp_path / "c"), split="train")) == 3
    # Writing over the record file itself is refused, --force or not (here through a link to it).
    caplog.clear()
    copy = tmp_path / "d" / "groups.jsonl"
    copy.parent.mkdir()
    copy.write_text(good[0] + "\n")
    (copy.parent / "groups.parquet").symlink_to(copy)
    assert main(["export", str(copy), "--out", str(copy.parent), "--force"]) == 1
    assert "is the record file itself" in caplog.text and copy.read_text() == good[0] + "\n"
    assert sorted(p.name for p in copy.parent.iterdir()) == ["groups.jsonl", "groups.parquet"]


def test_an_export_never_writes_over_a_file_unasked_nor_where_records_are_read(run_dir: Path, tmp_path: Path,
                                                                                caplog: pytest.LogCaptureFixture) -> None:
    import gzip

    from opd.records.__main__ import check_file

    good = (run_dir / "groups.jsonl").read_text().splitlines()
    # Another export's file in --out: refused, named, untouched; --force replaces it.
    out = tmp_path / "out"
    out.mkdir()
    (out / "groups.parquet").write_bytes(b"another run's rows")
    assert main(["export", str(run_dir), "--out", str(out)]) == 1
    assert "groups.parquet exists" in caplog.text and "--force" in caplog.text
    assert (out / "groups.parquet").read_bytes() == b"another run's rows"
    assert main(["export", str(run_dir), "--out", str(out), "--force"]) == 0
    assert len(datasets.load_dataset("parquet", data_dir=str(out), split="train")) == 3
    # Another run's records in --out (JSON lines): the rows file is never named like records.
    other = tmp_path / "other"
    other.mkdir()
    (other / "groups.jsonl").write_text(good[1] + "\n")
    assert main(["export", str(run_dir), "--format", "jsonl", "--out", str(other)]) == 0
    assert (other / "groups.jsonl").read_text() == good[1] + "\n"
    assert sorted(p.name for p in other.iterdir()) == ["groups.jsonl", "groups.rows.jsonl"]
    # A run holding only groups.jsonl.gz, exported into itself: its records are still what is read.
    gz_run = tmp_path / "gz_run"
    gz_run.mkdir()
    (gz_run / "groups.jsonl.gz").write_bytes(gzip.compress(("\n".join(good) + "\n").encode()))
    assert main(["export", str(gz_run), "--format", "jsonl", "--out", str(gz_run)]) == 0
    assert sorted(p.name for p in gz_run.iterdir()) == ["groups.jsonl.gz", "groups.rows.jsonl"]
    assert check_file(export.groups_file(gz_run)) == (2, [])
    # A hidden record file gives a file `datasets` reads (it skips hidden ones).
    hidden = tmp_path / ".groups.jsonl"
    hidden.write_text(good[0] + "\n")
    assert main(["export", str(hidden), "--out", str(tmp_path / "h")]) == 0
    assert [p.name for p in (tmp_path / "h").iterdir()] == ["groups.parquet"]
    # A run directory's groups.jsonl that is a link is refused (a run writes a file); the same
    # link named by the user is theirs to follow.
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "groups.jsonl").symlink_to(run_dir / "groups.jsonl")
    caplog.clear()
    assert main(["export", str(linked), "--out", str(tmp_path / "l1")]) == 1
    assert "linked/groups.jsonl" in caplog.text and not (tmp_path / "l1").exists()
    assert main(["export", str(linked / "groups.jsonl"), "--out", str(tmp_path / "l2")]) == 0


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_values_past_the_columns_or_floats_are_named_skips_and_the_rest_is_written(run_dir: Path, tmp_path: Path, fmt: str,
                                                                                   caplog: pytest.LogCaptureFixture) -> None:
    good = (run_dir / "groups.jsonl").read_text().splitlines()
    huge_version, huge_score, positive = json.loads(good[0]), json.loads(good[1]), json.loads(good[0])
    huge_version["group_overrides"]["weight_version"] = 2**64
    huge_score["scores"][0] = 10**400
    teacher = positive["overrides"][0]["teacher_logprobs"]
    teacher[next(i for i, t in enumerate(teacher) if t is not None)] = 0.5
    assert [p for g in (huge_version, huge_score, positive) for p in check_group(g)] == [
        "group_overrides.weight_version must be a non-negative integer below 2**63 (got 18446744073709551616)",
        "scores[0] is not a finite number (within float64's range): " + __import__("reprlib").repr(10**400),
        next(p for p in check_group(positive)),
    ]
    assert "teacher_logprobs" in check_group(positive)[0] and "<= 0" in check_group(positive)[0]
    mixed = tmp_path / "mixed.jsonl"
    surrogate = json.loads(good[1])
    surrogate["group_overrides"]["env"] = "x\ud800"  # valid JSON text, valid to the rules, no UTF-8 for the columns
    mixed.write_text("\n".join([good[0], json.dumps(huge_version), json.dumps(huge_score), json.dumps(positive), good[1], json.dumps(surrogate)]) + "\n")
    assert main(["check", str(mixed)]) == 1
    caplog.clear()
    assert main(["export", str(mixed), "--format", fmt, "--out", str(tmp_path / "out")]) == 1
    for line in (2, 3, 4, 6):
        assert re.search(rf"mixed\.jsonl: line {line}: .*skipped", caplog.text), line
    data = datasets.load_dataset("parquet" if fmt == "parquet" else "json", data_dir=str(tmp_path / "out"), split="train")
    assert len(data) == 3


def test_a_row_the_columns_cannot_hold_is_skipped_and_a_failed_write_leaves_nothing(run_dir: Path, tmp_path: Path,
                                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    good = recorded(run_dir)[0]
    rows = export.rows_of_group(good, 0)
    rows[0]["weight_version"] = 2**64  # past int64: what a group the rules pass could still never hold
    with pytest.raises(ValueError, match="typed columns cannot hold"):
        export.table_of_rows(rows)
    # The disk fills mid-write: the error named, exit 1, and no --out directory left behind.
    def full(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export.pq.ParquetWriter, "write_table", full)
    assert main(["export", str(run_dir), "--out", str(tmp_path / "new" )]) == 1
    assert not (tmp_path / "new").exists()


def test_the_docs_pytorch_example_trains_on_an_exported_run(run_dir: Path, tmp_path: Path, fixture_model: str) -> None:
    import torch

    page = (ROOT / "docs" / "records.md").read_text()
    (code,) = re.findall(r"### One batch into a PyTorch loss\n.*?```python\n(.*?)```", page, re.S)
    assert main(["export", str(run_dir), "--out", str(tmp_path / "dataset")]) == 0
    code = re.sub(r'^DIR = ".*"', f"DIR = {str(tmp_path / 'dataset')!r}", code, count=1, flags=re.M)
    code = re.sub(r'^MODEL = ".*"', f"MODEL = {fixture_model!r}", code, count=1, flags=re.M)
    scope: dict[str, Any] = {}
    exec(compile(code, "docs/records.md", "exec"), scope)
    loss, policy, mask, advantage = scope["loss"], scope["policy"], scope["mask"], scope["advantage"]
    assert loss.ndim == 0 and torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in policy.parameters() if p.requires_grad)
    # The loss reads the sampled tokens only, and the teacher's term moves the coding rollout's advantage where it scored.
    assert int(mask.sum()) == sum(int(m.sum()) for m in scope["batch"]["completion_mask"])
    coding = scope["batch"]["advantage"][0]
    assert ((advantage[0] - coding).abs() > 0.1).any() and mask[1:].sum() > 0


def test_the_parquet_sink_exports_the_runs_file_when_it_ends(run_dir: Path, tmp_path: Path) -> None:
    from opd.sinks.registry import SinkContext, build_sinks

    cfg = validate(compose(["sinks=[mlflow,parquet]", f"server.model={MODEL}"]))
    (tmp_path / "groups.jsonl").write_bytes((run_dir / "groups.jsonl").read_bytes())
    ctx = SinkContext(cfg=cfg, env=None, model=MODEL, base_urls=[], tracker=None, concurrency=1, out_dir=tmp_path)  # type: ignore[arg-type]
    _, sink = build_sinks(cfg.sinks, ctx)  # the file, then parquet (mlflow: not tracking)
    asyncio.run(sink.close("KILLED"))
    data = datasets.load_dataset("parquet", data_dir=str(tmp_path / "dataset"), split="train")
    assert len(data) == 3 and set(data["model"]) == {MODEL}
    assert sink.summary() == {"summary/parquet_rows": 3.0}


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_scores_near_float64s_largest_export_finite_advantages(run_dir: Path, tmp_path: Path, fmt: str) -> None:
    # Valid, finite scores whose mean's sum or std's squares overflow float64: each group's
    # advantages are finite, the better rollout's positive, in either format.
    math = recorded(run_dir)[1]
    lines = []
    for scores in ([1e308, 1e308 - 1e292], [1.7e308, -1.7e308], [-1e-300, 1e308]):
        group = {**math, "scores": scores}
        assert check_group(group) == []
        lines.append(json.dumps(group))
    (tmp_path / "huge.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["export", str(tmp_path / "huge.jsonl"), "--format", fmt, "--out", str(tmp_path / "out")]) == 0
    rows = by_group(datasets.load_dataset("parquet" if fmt == "parquet" else "json", data_dir=str(tmp_path / "out"), split="train").to_list())
    assert [[r["advantage"] for r in group] for group in rows] == [pytest.approx([1.0, -1.0], abs=1e-12)] * 2 + [pytest.approx([-1.0, 1.0], abs=1e-12)]


def test_a_failed_export_removes_every_directory_it_made_and_no_other(run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    def full(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export.pq.ParquetWriter, "write_table", full)
    # --out a/b/c where a/ was not there: none of the three is left.
    assert main(["export", str(run_dir), "--out", str(tmp_path / "a" / "b" / "c")]) == 1
    assert "No space left on device" in caplog.text and sorted(p.name for p in tmp_path.iterdir()) == []
    # Below a directory that was there (empty, as the user made it): it stays, what the export made goes.
    (tmp_path / "mine").mkdir()
    assert main(["export", str(run_dir), "--out", str(tmp_path / "mine" / "b" / "c")]) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["mine"] and list((tmp_path / "mine").iterdir()) == []
    # An --out that is a file: named, nothing made.
    (tmp_path / "file").write_text("x")
    caplog.clear()
    assert main(["export", str(run_dir), "--out", str(tmp_path / "file")]) == 1
    assert "file is not a directory" in caplog.text and sorted(p.name for p in tmp_path.iterdir()) == ["file", "mine"]


def test_a_run_directorys_dangling_groups_link_is_refused_not_passed_over_for_the_gz(run_dir: Path, tmp_path: Path,
                                                                                     caplog: pytest.LogCaptureFixture) -> None:
    import gzip

    run = tmp_path / "run"
    run.mkdir()
    (run / "groups.jsonl.gz").write_bytes(gzip.compress((run_dir / "groups.jsonl").read_bytes()))
    (run / "groups.jsonl").symlink_to(tmp_path / "gone.jsonl")
    assert export.groups_file(run) == run / "groups.jsonl"
    assert main(["export", str(run), "--out", str(tmp_path / "out")]) == 1
    assert re.search(r"run/groups\.jsonl is a symbolic link.*refused", caplog.text) and not (tmp_path / "out").exists()


def test_a_file_made_at_the_output_while_the_export_runs_is_never_replaced(run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    import errno

    from opd import run_files

    out = tmp_path / "out"
    out.mkdir()
    rows_of_group = export.rows_of_group

    def racing(*args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        # After the refusal's check, before the file is placed: another export writes the name.
        if not (out / "groups.parquet").exists():
            (out / "groups.parquet").write_bytes(b"another export's rows")
        return rows_of_group(*args, **kwargs)

    monkeypatch.setattr(export, "rows_of_group", racing)
    assert main(["export", str(run_dir), "--out", str(out)]) == 1
    assert "groups.parquet exists (made while the export ran)" in caplog.text
    assert [p.name for p in out.iterdir()] == ["groups.parquet"] and (out / "groups.parquet").read_bytes() == b"another export's rows"
    # --force: replaced, as asked.
    assert main(["export", str(run_dir), "--out", str(out), "--force"]) == 0
    assert len(datasets.load_dataset("parquet", data_dir=str(out), split="train")) == 3
    # A file system without hard links: checked, then renamed (an export still works, and still refuses).
    def no_links(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(run_files.os, "link", no_links)
    (out / "groups.parquet").unlink()
    assert main(["export", str(run_dir), "--out", str(out)]) == 1
    assert [p.name for p in out.iterdir()] == ["groups.parquet"] and (out / "groups.parquet").read_bytes() == b"another export's rows"
    monkeypatch.setattr(export, "rows_of_group", rows_of_group)
    assert main(["export", str(run_dir), "--out", str(tmp_path / "fresh")]) == 0
    assert [p.name for p in (tmp_path / "fresh").iterdir()] == ["groups.parquet"]
