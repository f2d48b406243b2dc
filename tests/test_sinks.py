"""Sinks by name (opd/sinks/registry.py): the config lists them, a sink of yours is a factory named
`module:attr`, and a name that is no sink fails before any server starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import compose
from opd.config import ConfigError, validate
from opd.sinks.base import Sink, Written
from opd.sinks.registry import SINKS, SinkContext, resolve


class _Recorder(Sink):
    """Appends each group's step and score sum to a file of its own."""

    def __init__(self, path: Path) -> None:
        self.path = path

    async def write(self, written: Written) -> None:
        with self.path.open("a") as handle:
            handle.write(json.dumps({"step": written.step, "groups_on_disk": len((self.path.parent / "groups.jsonl").read_text().splitlines())}) + "\n")


def recording_sink(ctx: SinkContext) -> Sink:
    """A sink of the user's: named in the config as test_sinks:recording_sink."""
    return _Recorder(ctx.out_dir / "recorded.jsonl")


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
    or evaluating: refused when the config is validated, naming `sinks`."""
    with pytest.raises(ConfigError) as info:
        validate(compose(overrides))
    assert info.value.key == "sinks" and message in str(info.value)


def test_a_run_that_does_not_use_a_sink_may_leave_it_out() -> None:
    for overrides in (["sinks=[mlflow]"], ["mode=evaluate", "eval.every=2", "sinks=[]"], ["trainer=local", "sinks=[trainer]"],
                      ["mode=serve", "eval.every=1", "sinks=[atropos,evaluation]"]):
        assert list(validate(compose(overrides)).sinks) == [s for s in overrides[-1][7:-1].split(",") if s]


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
