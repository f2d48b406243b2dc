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
        needs_scorer = True

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
        # Labelled with the kind's own name (not "model"), which the record rules hold to a row on every trained token.
        assert_taught(group, topk=4, teacher="scripted")
        assert group["group_overrides"]["teacher_model"] == "scripted_teacher"
    # Its scorer was probed once at start-up (can it return top-K rows?), then scored each rollout once.
    assert sorted(map(tuple, client.scored[1:])) == sorted(tuple(t) for g in groups for t in g["tokens"])


def scripted_kind(monkeypatch: pytest.MonkeyPatch, run: Any = None) -> type:
    """A kind `scripted` that declares it needs a scorer, registered for this test only; its
    `serve` yields `run` (None: it keeps the base's, which yields no scorer)."""
    from opd import teachers

    monkeypatch.setattr(teachers, "TEACHERS", teachers.TEACHERS.copy())

    class ScriptedTeacher(teachers.Teacher):
        needs_scorer = True

    if run is not None:
        def serve(self: Any, model: str, workdir: Path, sweep: Any = None) -> Iterator[Any]:
            yield run

        ScriptedTeacher.serve = contextlib.contextmanager(serve)  # type: ignore[method-assign]
    return teachers.TEACHERS.register("scripted")(ScriptedTeacher)


def test_a_kind_that_needs_a_scorer_and_serves_none_is_refused_naming_teacher_kind_before_any_server_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It declares rows on every trained token but keeps the base `serve`, which gives no scorer:
    before, the run went on and wrote groups without a single teacher row."""
    from experiments.launch import launch
    from opd import experiment

    scripted_kind(monkeypatch)
    monkeypatch.setattr(experiment, "inference_servers", lambda *a, **k: pytest.fail("a server was started"))
    with pytest.raises(ConfigError) as info:
        launch(compose([f"output_dir={tmp_path / 'run'}", f"tracking.artifact_root={tmp_path / 'mlruns'}", "teacher.kind=scripted"]))
    assert info.value.key == "teacher.kind"
    assert str(info.value).startswith("teacher.kind: teacher=scripted needs a scorer (it writes a teacher row on every trained token) but its serve() "
                                      "gives none")
    assert not (tmp_path / "run" / "groups.jsonl").exists()


@pytest.mark.parametrize("mode", ["train", "evaluate"])
def test_a_kind_whose_run_gives_no_scorer_is_refused_at_start_where_groups_are_written(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its `serve` is its own, but the run it yields has no scorer: the run stops as the
    environment is built, naming teacher.kind; mode=evaluate measures the policy alone."""
    from opd.teachers import TeacherRun
    from opd.tracking.traces import Tracer

    kind = scripted_kind(monkeypatch, TeacherRun())(validate(compose(["teacher.kind=scripted", f"mode={mode}"])))
    if mode == "evaluate":
        assert kind.scorer(TeacherRun(), [], Tracer.off()) is None
        return
    with pytest.raises(ConfigError, match=r"^teacher.kind: teacher=scripted needs a scorer .* its run gives none \(TeacherRun.scorer of TeacherRun returned None\)$") as info:
        kind.scorer(TeacherRun(), [], Tracer.off())
    assert info.value.key == "teacher.kind"


def test_a_kind_that_needs_a_scorer_gives_environment_workers_theirs_or_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """runner.workers > 1: each worker builds its scorer from `TeacherRun.for_workers`; a run
    that gives none would have the workers write groups without rows."""
    from opd.teachers import TeacherRun
    from opd.tracking.traces import Tracer

    class Scoring(TeacherRun):
        def scorer(self, policy_urls: list[str], tracer: Any) -> Any:
            return object()

    kind = scripted_kind(monkeypatch, Scoring())(validate(compose(["teacher.kind=scripted", "runner.workers=2"])))
    with pytest.raises(ConfigError, match=r"^teacher.kind: teacher=scripted gives environment workers \(runner.workers=2\) no scorer") as info:
        kind.scorer(Scoring(), [], Tracer.off())
    assert info.value.key == "teacher.kind"


def test_a_group_labelled_with_a_plug_in_kind_is_held_to_a_row_on_every_trained_token(fixture_model: str, tokenizer: Any,
                                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The base environment labels the group with the kind that scored it, and the record rules
    hold any kind's label to a row on every trained token (before, only `model` was checked: a
    plug-in kind's group could lack rows and pass)."""
    import asyncio
    import json

    from opd import build
    from opd.data.sources import TaskSet
    from opd.distill.teacher_model import TeacherModel
    from opd.records import DISTILL_PAD_ID, DISTILL_PAD_LOGPROB, MASK, check_group
    from opd.serving.pool import ServerPool
    from opd.tracking.traces import Tracer
    from scripted import ScriptedClient, text_generator
    from test_teacher import MATH_ANSWER, MATH_CALL, MATH_ITEM, teacher_rows

    scripted_kind(monkeypatch)
    policy = ScriptedClient(generate=text_generator(tokenizer, [(MATH_CALL, "stop"), (MATH_ANSWER, "stop")] * 2))
    scorer = TeacherModel(ServerPool([ScriptedClient(score=teacher_rows)], 4, 3, backoff_s=0.01), "scripted_teacher", 4)
    env = build.environment(validate(compose(["group_size=2", "teacher.kind=scripted"])), TaskSet(train=[MATH_ITEM], eval=[], source="test"),
                            fixture_model, ServerPool([policy], 8, 3, backoff_s=0.01), Tracer.off(), None, scorer)
    try:
        group, _ = asyncio.run(env.collect_trajectories(MATH_ITEM))
    finally:
        asyncio.run(env.close())
    assert group["group_overrides"]["teacher"] == "scripted" and check_group(group) == []
    assert env.group_metrics(group)["teacher/token_coverage"] == 1.0
    trained = [p for p, m in enumerate(group["masks"][0]) if m != MASK]
    holed = json.loads(json.dumps(group))
    holed["distill_token_ids"][0][trained[2]] = [DISTILL_PAD_ID] * 4
    holed["distill_logprobs"][0][trained[2]] = [DISTILL_PAD_LOGPROB] * 4
    assert f"trained token [0][{trained[2]}] has no teacher row or teacher logprob, but group_overrides.teacher is scripted" in check_group(holed)


def test_a_sweep_starts_the_server_a_kind_shares_without_knowing_the_kind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep's callback asks the teacher component for the server its jobs share: a kind of
    yours that has one gets it started once before the jobs (its URLs and settings in the sweep's
    state) and stopped after them; before, only teacher=model's was, by the callback itself."""
    from omegaconf import open_dict, read_write

    from opd.config import compose as compose_hydra
    from opd.sweep.callback import SweepCallback
    from opd.sweep.state import read_state

    events: list[tuple[str, Path | None]] = []

    class Shared:  # an opd.teachers.SharedServer
        def __init__(self, workdir: Path) -> None:
            self.workdir = workdir

        def start(self) -> tuple[list[str], dict[str, Any]]:
            events.append(("start", self.workdir))
            return ["http://127.0.0.1:1/v1"], {"model": "scripted"}

        def stop(self) -> None:
            events.append(("stop", None))

    kind = scripted_kind(monkeypatch)
    kind.shared_server = lambda self, workdir: Shared(workdir)  # type: ignore[attr-defined]
    cfg = compose_hydra(["teacher.kind=scripted", "server=vllm", "server.model=fixture", "server.base_urls=[http://127.0.0.1:9/v1]",
                         "tracking.enabled=false", "runner.progress=false", f"hydra.sweep.dir={tmp_path}"], hydra=True)
    with read_write(cfg), open_dict(cfg):
        cfg.hydra.overrides.task = ["seed=0,1"]
    callback = SweepCallback()
    callback.on_multirun_start(cfg)
    state = read_state(tmp_path)
    assert state is not None and state.teacher_urls == ["http://127.0.0.1:1/v1"] and state.teacher_settings == {"model": "scripted"}
    assert state.server_urls is None  # server=vllm: the policy's servers are running ones
    assert events == [("start", tmp_path / "vllm_teacher")]
    callback.on_multirun_end(cfg)
    assert events[-1] == ("stop", None) and len(events) == 2


def test_teacher_model_shares_a_local_server_whose_settings_its_jobs_match(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """teacher=model's shared server: none with a running one or mode=evaluate; else a local one,
    whose settings in the sweep's state are those a job of the same config finds and uses."""
    from opd import teachers
    from opd.sweep.state import SweepState, shared_teacher_for

    started: list[Any] = []

    class Local:
        def __init__(self, cfg: Any, teacher: str, workdir: Path) -> None:
            self.teacher, self.workdir = teacher, workdir

        def start(self) -> str:
            started.append(self)
            return "http://127.0.0.1:2/v1"

        def stop(self) -> None:
            started.remove(self)

    monkeypatch.setattr(teachers, "local_teacher_server", Local)
    base = ["teacher=model", "teacher.server.model=fixture_teacher"]
    assert teachers.teacher_of(validate(compose([*base, "teacher.server.base_url=http://127.0.0.1:3/v1"]))).shared_server(tmp_path) is None
    assert teachers.teacher_of(validate(compose([*base, "mode=evaluate"]))).shared_server(tmp_path) is None
    cfg = validate(compose(base))
    shared = teachers.teacher_of(cfg).shared_server(tmp_path / "vllm_teacher")
    assert shared is not None
    urls, settings = shared.start()
    (local,) = started
    assert urls == ["http://127.0.0.1:2/v1"] and local.workdir == tmp_path / "vllm_teacher"
    state = SweepState(sweep_dir=str(tmp_path), swept=["seed"], teacher_urls=urls, teacher_settings=settings)
    assert shared_teacher_for(state, cfg, local.teacher) == urls
    assert shared_teacher_for(state, validate(compose([*base, "teacher.topk=5"])), local.teacher) is None
    shared.stop()
    assert started == []


def test_each_environment_worker_builds_its_scorer_through_the_kind(fixture_model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """runner.workers > 1: a worker gets the scorer of the run's own kind, rebuilt from what the
    driver's run shipped (`TeacherRun.for_workers`) by the kind's registry entry and the driver's
    call (`Teacher.scorer`); before, a worker built a TeacherModel from teacher=model's config
    fields whatever the kind (a plug-in kind's config has none of them)."""
    import copy

    from opd import build
    from opd.distributed.worker import EnvWorker
    from opd.teachers import TeacherRun

    class Shipped(TeacherRun):  # picklable: the workers use the run itself
        def scorer(self, policy_urls: list[str], tracer: Any) -> Any:
            return ("scripted scorer", tuple(policy_urls))

        def for_workers(self) -> Any:
            return self

    kind = scripted_kind(monkeypatch, Shipped())
    cfg = validate(compose(["teacher.kind=scripted", "runner.workers=2", f"server.model={fixture_model}"]))
    built: list[Any] = []
    monkeypatch.setattr(build, "environment", lambda *args: built.append(args[-1]))
    EnvWorker(copy.copy(cfg), None, fixture_model, ["http://127.0.0.1:9/v1"], 1, 2, (kind, Shipped()))  # type: ignore[arg-type]
    assert built == [("scripted scorer", ("http://127.0.0.1:9/v1",))]
    from opd.teachers import workers_teacher  # what the driver ships: the kind's registry entry and its run's part

    shipped = Shipped()
    assert workers_teacher(cfg, shipped) == (kind, shipped)


def test_a_teacher_model_worker_scores_on_the_drivers_servers_within_its_share(fixture_model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from opd.distill.teacher_model import TeacherModel
    from opd.distributed.worker import teacher_scorer
    from opd.teachers import ModelTeacher, ModelTeacherRun, workers_teacher

    cfg = validate(compose(["teacher=model", "teacher.server.model=fixture_teacher", "runner.workers=2", "teacher.max_concurrent=3", "distill_topk=4"]))
    run = ModelTeacherRun(cfg, "/models/teacher", None)  # type: ignore[arg-type]
    assert workers_teacher(cfg, run) is None  # its server not yet asked for its URLs: nothing to ship
    run.urls = ["http://127.0.0.1:7/v1"]
    teacher = workers_teacher(cfg, run)
    assert teacher == (ModelTeacher, ("/models/teacher", ["http://127.0.0.1:7/v1"]))
    import copy

    shares = []
    for index in (0, 1):
        own = copy.copy(cfg)
        scorer = teacher_scorer(own, teacher, ["http://127.0.0.1:9/v1"], index, 2)
        assert isinstance(scorer, TeacherModel) and scorer.top_k == 4
        assert [c.base_url for c in scorer.pool.clients] == ["http://127.0.0.1:7/v1"]
        shares.append(own.teacher.max_concurrent)
    assert shares == [2, 1] and cfg.teacher.max_concurrent == 3
