"""experiments/bench/same_records.py: its diff of two runs' records (fast), and the whole check run
on this tree against itself and against a copy whose config changes the prompts (slow)."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT
from experiments.bench.same_records import ADDED, REMOVED, RUN_SPECIFIC, compare_groups, groups_by_item, main, summary
from helpers import make_group, sequence


def _group(item: str, prompt: int = 7, **group_overrides: Any) -> dict[str, Any]:
    rollouts = [sequence([1, prompt, 3], [40, 41], -0.5), sequence([1, prompt, 3], [42], -0.25)]
    group = make_group(rollouts, [1.0, -1.0], group_overrides={"item_id": item, "weight_version": 0, **group_overrides})
    group["overrides"] = [{"reward_signals": {"correct": 1.0}, "passed": True}, {"reward_signals": {"correct": 0.0}, "passed": False}]
    return group


def _write(path: Path, groups: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    path.write_text("".join(json.dumps(g) + "\n" for g in groups))
    return groups_by_item(path)


def _unexpected(other: list[dict[str, Any]], this: list[dict[str, Any]], tmp_path: Path) -> list[tuple[str, str, str]]:
    found = compare_groups(_write(tmp_path / "other.jsonl", other), _write(tmp_path / "this.jsonl", this))
    return [(d.item, d.kind, d.path) for d in found if not d.expected]


def test_the_same_groups_in_another_order_are_identical(tmp_path: Path) -> None:
    groups = [_group("a"), _group("b", prompt=8), _group("a", prompt=9)]  # item a drawn twice
    assert _unexpected(groups, copy.deepcopy(groups[::-1]), tmp_path) == []


@pytest.mark.parametrize("change, expected", [
    (lambda g: g["tokens"][1].__setitem__(3, 99), ("a", "changed", "tokens[1][3]")),
    (lambda g: g["masks"][0].append(-100), ("a", "length", "masks[0]")),
    (lambda g: g["scores"].__setitem__(0, 0.5), ("a", "changed", "scores[0]")),
    (lambda g: g["overrides"][1]["reward_signals"].__setitem__("correct", 1.0), ("a", "changed", "overrides[1].reward_signals.correct")),
    (lambda g: g.__setitem__("advantages", [0.5, -0.5]), ("a", "added", "advantages")),
    (lambda g: g["group_overrides"].pop("weight_version"), ("a", "removed", "group_overrides.weight_version")),
    # A deliberately added field is excused only where the other side lacks it, not when its value changes.
    (lambda g: g["overrides"][0].__setitem__("passed", False), ("a", "changed", "overrides[0].passed")),
    (lambda g: g["group_overrides"].__setitem__("item_id", "c"), ("a", "groups", "groups")),
], ids=["token", "mask-length", "score", "reward-signal", "new-field", "lost-field", "added-field-value", "other-item"])
def test_every_other_difference_is_named_by_item_and_path(change: Any, expected: tuple[str, str, str], tmp_path: Path) -> None:
    this = _group("a")
    change(this)
    assert expected in _unexpected([_group("a")], [this], tmp_path)


def test_run_specific_and_added_fields_are_reported_apart_with_their_reason(tmp_path: Path) -> None:
    other = _group("a", opd_wall_s=0.9)
    for rollout in other["overrides"]:
        del rollout["passed"]  # an older run: no per-rollout pass yet
    this = _group("a", opd_wall_s=2.3, env="inline_math")
    runs = (_write(tmp_path / "other.jsonl", [other]), _write(tmp_path / "this.jsonl", [this]))
    result = summary("inline_math", *runs, compare_groups(*runs))
    assert result["identical"] and result["groups"] == [1, 1] and result["rollouts"] == 2
    assert result["expected"] == {
        "group_overrides.env": {"count": 1, "why": ADDED["group_overrides.env"]},
        "group_overrides.opd_wall_s": {"count": 1, "why": RUN_SPECIFIC["group_overrides.opd_wall_s"]},
        "overrides[].passed": {"count": 2, "why": ADDED["overrides[].passed"]},
    }
    # The other way round a field has gone missing: not excused.
    runs = runs[::-1]
    result = summary("inline_math", *runs, compare_groups(*runs))
    assert not result["identical"] and result["unexpected_fields"] == ["group_overrides.env", "overrides[].passed"]


def test_a_field_removed_on_purpose_is_excused_only_where_the_other_side_has_it(tmp_path: Path) -> None:
    """inline_math's `correct` said what `passed` says: this side no longer writes it. Its
    absence here is excused with the reason; the field appearing here again is not."""
    other = _group("a")
    for rollout in other["overrides"]:
        rollout["correct"] = rollout["passed"]  # an older run: the verdict twice
    runs = (_write(tmp_path / "other.jsonl", [other]), _write(tmp_path / "this.jsonl", [_group("a")]))
    result = summary("inline_math", *runs, compare_groups(*runs))
    assert result["identical"] and result["expected"] == {"overrides[].correct": {"count": 2, "why": REMOVED["overrides[].correct"]}}
    runs = runs[::-1]
    assert summary("inline_math", *runs, compare_groups(*runs))["unexpected_fields"] == ["overrides[].correct"]


def test_nan_equals_nan_and_a_group_without_an_item_id_is_refused(tmp_path: Path) -> None:
    assert _unexpected([_group("a", loss=float("nan"))], [_group("a", loss=float("nan"))], tmp_path) == []
    (tmp_path / "bad.jsonl").write_text(json.dumps({"tokens": [[1]], "group_overrides": {}}) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl:1: a group without group_overrides.item_id"):
        groups_by_item(tmp_path / "bad.jsonl")


def test_a_revision_that_does_not_exist_is_no_comparison_exit_2(caplog: pytest.LogCaptureFixture) -> None:
    assert main(["--rev", "no-such-revision-here"]) == 2
    assert "--rev no-such-revision-here: git archive failed" in caplog.text


@pytest.mark.slow
def test_the_check_passes_on_this_tree_and_fails_on_a_copy_with_other_prompts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--env", "inline_math", "--groups", "2", "--keep", str(tmp_path / "runs")]
    assert main(["--root", str(ROOT), *args]) == 0
    same = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert same["identical"] and same["groups"] == [2, 2] and same["rollouts"] == 8
    copied = tmp_path / "copy"
    shutil.copytree(ROOT, copied, ignore=shutil.ignore_patterns(".venv", ".git", "outputs", "__pycache__"))
    env_yaml = copied / "conf/env/inline_math.yaml"
    assert "\nfew_shots: 2\n" in env_yaml.read_text()
    env_yaml.write_text(env_yaml.read_text().replace("\nfew_shots: 2\n", "\nfew_shots: 1\n"))
    assert main(["--root", str(copied), *args[:-1], str(tmp_path / "runs2")]) == 1
    changed = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert not changed["identical"] and "tokens[]" in changed["unexpected_fields"]
