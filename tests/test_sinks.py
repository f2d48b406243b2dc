"""Sinks by name (opd/sinks/registry.py): the config lists them, a sink of yours is a factory named
`module:attr`, and a name that is no sink fails before any server starts."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

import opd.sinks.registry as sink_registry
from conftest import compose
from opd.config import ConfigError, validate
from opd.sinks.base import Sink, Written
from opd.sinks.registry import SINKS, SinkContext, build_sinks, check_sinks, resolve


class _Recorder(Sink):
    """Appends each group's step and score sum to a file of its own."""

    def __init__(self, path: Path, settings: object = None) -> None:
        self.path, self.settings = path, settings

    async def write(self, written: Written) -> None:
        with self.path.open("a") as handle:
            handle.write(json.dumps({"step": written.step, "groups_on_disk": len((self.path.parent / "groups.jsonl").read_text().splitlines())}) + "\n")


def recording_sink(ctx: SinkContext) -> Sink:
    """A sink of the user's: named in the config as test_sinks:recording_sink."""
    return _Recorder(ctx.out_dir / (ctx.settings.file if ctx.settings is not None else "recorded.jsonl"), ctx.settings)


def test_a_name_that_is_no_sink_is_a_config_error_naming_sinks() -> None:
    assert resolve("mlflow") is SINKS["mlflow"] and resolve("test_sinks:recording_sink") is recording_sink
    with pytest.raises(ConfigError, match=r"sinks: no sink named 'mlflo'; did you mean mlflow\? \(sinks: mlflow, atropos, trainer, evaluation, parquet; "
                                          r"or package.module:factory\)"):
        resolve("mlflo")
    with pytest.raises(ConfigError, match="sinks: cannot load 'no_such_module:f': ModuleNotFoundError"):
        resolve("no_such_module:f")
    with pytest.raises(ConfigError, match="sinks: cannot load 'test_sinks:missing': AttributeError"):
        resolve("test_sinks:missing")


def test_an_unknown_sink_fails_at_the_preflight(fixture_model: str) -> None:
    from opd.build import preflight

    with pytest.raises(ConfigError, match="sinks: no sink named 'wandb'"):
        preflight(validate(compose(["sinks=[mlflow,wandb]"])), fixture_model)


@pytest.mark.parametrize(("overrides", "message"), [
    (["trainer=local", "sinks=[jsonl,mlflow]"], "sinks must be a list holding trainer (trainer=local trains on the groups the trainer sink hands it), "
                                                "got ['jsonl', 'mlflow']; add it: sinks=[mlflow,trainer]"),
    (["mode=serve", "sinks=[mlflow,trainer,evaluation]"], "sinks must be a list holding atropos (mode=serve sends the groups"),
    (["trainer=atropos", "sinks=[mlflow]"], "sinks must be a list holding atropos (trainer=atropos takes the groups"),
    (["eval.every=2", "sinks=[mlflow,atropos,trainer]"], "sinks must be a list holding evaluation (eval.every=2 evaluates through the evaluation sink)"),
    (["sinks=[jsonl,mlflow]"], "sinks must be names of sinks after groups.jsonl (always written, first: leave jsonl out)"),
])
def test_a_run_whose_sinks_leave_out_what_it_needs_is_refused_naming_sinks(overrides: list[str], message: str) -> None:
    """A run that needs a sink the list leaves out would run to its end without training, serving
    or evaluating: refused by what the sinks declare (at the preflight, and a sweep's start), naming `sinks`."""
    with pytest.raises(ConfigError) as info:
        check_sinks(validate(compose(overrides)))
    assert info.value.key == "sinks" and message in str(info.value)


def test_a_run_that_leaves_out_a_sink_it_needs_stops_before_any_server_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from experiments.launch import launch
    from opd import experiment

    monkeypatch.setattr(experiment, "inference_servers", lambda *a, **k: pytest.fail("a server was started"))
    with pytest.raises(ConfigError, match=r"^sinks must be a list holding trainer \(trainer=local") as info:
        launch(compose([f"output_dir={tmp_path / 'run'}", "tracking.enabled=false", "trainer=local", "sinks=[mlflow]"]))
    assert info.value.key == "sinks" and not (tmp_path / "run" / "groups.jsonl").exists()


def test_a_run_that_does_not_use_a_sink_may_leave_it_out() -> None:
    for overrides in (["sinks=[mlflow]"], ["mode=evaluate", "eval.every=2", "sinks=[]"], ["trainer=local", "sinks=[trainer]"],
                      ["mode=serve", "eval.every=1", "sinks=[atropos,evaluation]"]):
        cfg = validate(compose(overrides))
        check_sinks(cfg)
        assert list(cfg.sinks) == [s for s in overrides[-1][7:-1].split(",") if s]


@pytest.mark.slow
def test_a_sink_of_yours_gets_every_group_after_the_file_has_it(tmp_path: Path) -> None:
    from experiments.bench.common import scripted_server
    from experiments.launch import launch
    from opd.fixture.build import ensure_fixture

    out = tmp_path / "run"
    with scripted_server(0.01) as url:
        launch(compose(["env=inline_math", "server=vllm", f"server.model={ensure_fixture()}", f"server.base_urls=[{url}]", "total_steps=3",
                        "group_size=2", f"output_dir={out}", "tracking.enabled=false", "runner.progress=false",
                        "sinks=[mlflow,atropos,trainer,evaluation,test_sinks:recording_sink]"]))
    recorded = [json.loads(line) for line in (out / "recorded.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recorded] == [1, 2, 3]
    assert all(r["groups_on_disk"] >= r["step"] for r in recorded)  # groups.jsonl is always first


@dataclass
class _RecorderSettings:
    # The file it appends to, in the run's directory.
    file: str = "recorded.jsonl"


@pytest.fixture
def own_sink(monkeypatch: pytest.MonkeyPatch) -> None:
    """`recording_sink` registered (in a copy of the registry) as the sink `recording`, the way a
    sink of yours registers itself: needed by runs of group_size=3, with settings of its own."""
    sinks = SINKS.copy()
    sinks.add("recording", recording_sink, required_by=lambda cfg: "group_size=3 is recorded" if cfg.group_size == 3 else None,
              settings=_RecorderSettings)
    monkeypatch.setattr(sink_registry, "SINKS", sinks)


def test_a_sink_of_yours_declares_which_runs_need_it(own_sink: None) -> None:
    """What needs a sink is metadata on its registry entry, read for every registered sink: one of
    yours refuses a run that needs it and leaves it out; named by its factory, it counts as listed."""
    with pytest.raises(ConfigError) as info:
        check_sinks(validate(compose(["group_size=3", "sinks=[mlflow]"])))
    assert info.value.key == "sinks" and "sinks must be a list holding recording (group_size=3 is recorded)" in str(info.value)
    assert "add it: sinks=[mlflow,recording]" in str(info.value)
    for listed in ("recording", "test_sinks:recording_sink"):
        check_sinks(validate(compose(["group_size=3", f"sinks=[mlflow,{listed}]"])))
    check_sinks(validate(compose(["group_size=2", "sinks=[mlflow]"])))


@pytest.mark.parametrize(("overrides", "key", "message"), [
    (["+sink_settings.parquet.dirr=x"], "sink_settings.parquet.dirr", "sink parquet has no setting 'dirr'; did you mean dir? (its settings: dir)"),
    (["+sink_settings.parquett.dir=x"], "sink_settings.parquett", "no sink named 'parquett'; did you mean parquet?"),
    (["+sink_settings.mlflow.upload=false"], "sink_settings.mlflow", "sink mlflow takes no settings, got upload"),
    (["sink_settings.parquet.dir=../elsewhere"], "sink_settings.parquet.dir", "must be a folder inside the run's directory"),
    (["sink_settings.parquet.dir=/tmp/x"], "sink_settings.parquet.dir", "must be a folder inside the run's directory"),
    (["~sink_settings.parquet.dir"], "sink_settings.parquet.dir", "must be set"),
])
def test_a_bad_sink_setting_is_a_config_error_naming_its_key(overrides: list[str], key: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_sinks(validate(compose(overrides)))
    assert info.value.key == key and message in str(info.value)


def test_a_sink_gets_its_settings(tmp_path: Path, own_sink: None) -> None:
    """Each sink's factory reads its own `sink_settings.<name>` (defaults where the config gives
    none): the parquet sink's folder, a sink of yours its own keys, a mistyped one refused."""
    cfg = validate(compose(["sinks=[parquet,test_sinks:recording_sink]", "sink_settings.parquet.dir=data/set", "+sink_settings.recording.file=mine.jsonl"]))
    ctx = SinkContext(cfg, env=None, model="m", base_urls=[], tracker=None, concurrency=1, out_dir=tmp_path)  # type: ignore[arg-type]
    _, parquet, recorder = build_sinks(list(cfg.sinks), ctx)
    assert parquet.out_dir == tmp_path / "data" / "set"
    assert recorder.path == tmp_path / "mine.jsonl" and recorder.settings == _RecorderSettings("mine.jsonl")
    cfg = validate(compose(["sinks=[test_sinks:recording_sink]"]))
    assert build_sinks(list(cfg.sinks), SinkContext(cfg, None, "m", [], None, 1, tmp_path))[1].settings == _RecorderSettings()  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"sink_settings.recording.fil: sink recording has no setting 'fil'; did you mean file\?"):
        check_sinks(validate(compose(["sinks=[test_sinks:recording_sink]", "+sink_settings.recording.fil=x"])))
