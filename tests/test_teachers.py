"""The teacher as a component (opd/teachers.py): each kind registered under the name `teacher.kind`
gives, a mistyped one refused naming `teacher`, and a kind of yours run by the experiment through
the interface alone (its preflight, its server's start and stop, its scorer's rows on every
trained token) with no framework file edited."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator

import pytest

from conftest import ROOT, compose
from opd.config import ConfigError, validate


def test_each_kind_is_registered_under_the_name_its_config_selects() -> None:
    from opd.teachers import TEACHERS, ModelTeacher, NoTeacher, SelfHintTeacher, teacher_of

    assert TEACHERS.names == ["none", "self_hint", "model"]
    assert type(teacher_of(validate(compose(["env=inline_math"])))) is NoTeacher
    assert type(teacher_of(validate(compose(["env=opd_coding"])))) is SelfHintTeacher
    assert type(teacher_of(validate(compose(["teacher=model", "teacher.server.model=fixture"])))) is ModelTeacher


def test_a_mistyped_teacher_kind_is_refused_naming_teacher_and_the_nearest_kind_before_anything_is_written(tmp_path: Path) -> None:
    from experiments.launch import launch

    with pytest.raises(ConfigError) as info:
        launch(compose([f"output_dir={tmp_path / 'run'}", f"tracking.artifact_root={tmp_path / 'mlruns'}", "teacher.kind=self-hint"]))
    assert str(info.value) == "teacher: no teacher named 'self-hint'; did you mean self_hint? (teachers: none, self_hint, model)"
    assert info.value.key == "teacher" and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_teacher_kind_registered_by_a_test_runs_through_the_experiment_with_its_rows_on_every_trained_token(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from experiments.bench import scripted_server
    from helpers import assert_taught, launch
    from opd import teachers
    from opd.distill.teacher_model import TeacherModel
    from opd.records import read_groups
    from opd.serving.pool import ServerPool
    from scripted import ScriptedClient
    from test_teacher import teacher_rows

    monkeypatch.setattr(teachers, "TEACHERS", teachers.TEACHERS.copy())
    calls: list[str] = []
    client = ScriptedClient(score=teacher_rows)

    class ScriptedRun(teachers.TeacherRun):
        def scorer(self, policy_urls: list[str], tracer: Any) -> Any:
            calls.append("scorer")
            return TeacherModel(ServerPool([client], 4, 3, backoff_s=0.01), "scripted_teacher", 4, tracer)

    @teachers.TEACHERS.register("scripted")
    class ScriptedTeacher(teachers.Teacher):
        def rows(self) -> str | None:
            return "teacher=scripted"

        def preflight(self, model: str) -> None:
            super().preflight(model)
            calls.append("preflight")

        @contextlib.contextmanager
        def serve(self, model: str, workdir: Path, sweep: Any = None) -> Iterator[teachers.TeacherRun]:
            calls.append("start")
            try:
                yield ScriptedRun()
            finally:
                calls.append("stop")

    with scripted_server(0.01) as url:
        launch(tmp_path, ROOT / "opd/fixture/model", url, ["env=inline_math", "teacher.kind=scripted", "distill_topk=4", "total_steps=2",
                                                             "group_size=2", "tracking.enabled=false"])
    assert calls == ["preflight", "start", "scorer", "stop"]
    groups = list(read_groups(tmp_path / "run" / "groups.jsonl"))
    assert len(groups) == 2
    for group in groups:
        assert_taught(group, topk=4)
        assert group["group_overrides"]["teacher_model"] == "scripted_teacher"
    # Its scorer was probed once at start-up (can it return top-K rows?), then scored each rollout once.
    assert sorted(map(tuple, client.scored[1:])) == sorted(tuple(t) for g in groups for t in g["tokens"])
