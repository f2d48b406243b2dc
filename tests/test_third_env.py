"""A new environment is one place: tests/third_env/ (its class, data, schemas, rubric and config
files) runs through the launcher, the records, MLflow and the viewer with no framework file edited."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from opd.records import check_group, read_groups

THIRD = Path(__file__).resolve().parent / "third_env"


@pytest.mark.slow
def test_a_third_environment_outside_opd_runs_through_launcher_records_mlflow_and_viewer(tmp_path: Path) -> None:
    import mlflow

    from experiments.bench.common import scripted_server
    from opd.fixture.build import ensure_fixture

    run_dir, uri = tmp_path / "run", f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(THIRD.parent), os.environ.get("PYTHONPATH", "")])}
    with scripted_server(0.01) as url:
        proc = subprocess.run([
            sys.executable, "-m", "experiments.launch", f"hydra.searchpath=[file://{THIRD / 'conf'}]", "env=echo",
            "server=vllm", f"server.model={ensure_fixture()}", f"server.base_urls=[{url}]", "total_steps=3", "group_size=2", "eval.every=3",
            f"hydra.run.dir={run_dir}", f"tracking.uri={uri}", f"tracking.artifact_root={tmp_path / 'mlruns'}", "runner.progress=false",
        ], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    groups = list(read_groups(run_dir / "groups.jsonl"))
    assert len(groups) == 3 and all(check_group(g) == [] for g in groups)
    assert {g["group_overrides"]["env"] for g in groups} == {"echo"}
    assert all(set(d["reward_signals"]) == {"said"} and isinstance(d["passed"], bool) for g in groups for d in g["overrides"])
    (run,) = mlflow.MlflowClient(uri).search_runs([mlflow.MlflowClient(uri).get_experiment_by_name("echo").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["env"] == "echo" and run.data.params["env.max_tokens"] == "16"
    assert "reward/said" in run.data.metrics and "eval/accuracy" in run.data.metrics
    page = (run_dir / "groups.html").read_text()
    assert '"echo"' in page  # the index rows name the environment the records name


def test_an_environment_without_a_spec_is_named_in_one_line(tmp_path: Path) -> None:
    from opd.config import ConfigError, validate
    from opd.envs.registry import spec_of

    with pytest.raises(ConfigError, match=r"env.name: no environment named 'echo' \(environments: inline_math, opd_coding; or env.spec="):
        spec_of({"name": "echo"})
    with pytest.raises(ConfigError, match="env.spec: cannot load 'third_env.nowhere:SPEC': ModuleNotFoundError"):
        spec_of({"name": "echo", "spec": "third_env.nowhere:SPEC"})
    from conftest import compose

    with pytest.raises(ConfigError, match=r"env.max_tokens"):
        validate(compose([f"hydra.searchpath=[file://{THIRD / 'conf'}]", "env=echo", "env.max_tokens=abc"]))


def test_a_third_environment_with_a_teacher_model_has_its_row_on_every_trained_token(fixture_model, tokenizer) -> None:
    """The base environment makes the group: an env of yours that only writes `rollout` gets
    teacher=model's rows on every sampled token, as the built-ins do (echo used to write none)."""
    import asyncio

    from conftest import compose
    from opd.config import validate
    from opd.data.sources import TaskSet
    from scripted import ScriptedClient, build_env, text_generator
    from test_teacher import TEACHER, assert_taught_everywhere, teacher_rows

    item = {"id": "echo-0", "word": "apple"}
    policy = ScriptedClient(generate=text_generator(tokenizer, [("Apple.<|im_end|>", "stop"), ("pear<|im_end|>", "stop")]))
    teacher = ScriptedClient(score=teacher_rows)
    cfg = validate(compose([f"hydra.searchpath=[file://{THIRD / 'conf'}]", "env=echo", "group_size=2", *TEACHER]))
    env = build_env(cfg, TaskSet(train=[item], eval=[item], source="test"), fixture_model, policy, teacher=teacher)
    try:
        group, _ = asyncio.run(env.collect_trajectories(item))
    finally:
        asyncio.run(env.close())
    assert check_group(group) == []
    assert_taught_everywhere(group, teacher)
    assert sorted(d["passed"] for d in group["overrides"]) == [False, True] and sorted(group["scores"]) == [0.0, 1.0]
    assert env.group_metrics(group)["teacher/token_coverage"] == 1.0


def test_an_environment_without_a_rollout_fails_where_its_class_is_defined() -> None:
    from opd.envs.base import RolloutEnv

    with pytest.raises(TypeError, match=r"Incomplete: an environment implements `async def rollout\(self, item, temperature, prepared\)"):
        type("Incomplete", (RolloutEnv,), {"name": "incomplete"})


def test_an_environment_declares_its_budgets_and_tools_with_no_constructor_of_its_own(fixture_model, tokenizer) -> None:
    """The base reads what an env declares: its budgets (`budget_fields`: env.* fields every group
    keeps in `generation_params`) and its tools (`tool_schemas`: the chat format's start-up check
    and the turn parser). echo declares its budget and needs no constructor."""
    import asyncio

    from conftest import compose
    from opd import build
    from opd.config import validate
    from opd.data.sources import TaskSet
    from opd.envs import math_prompt
    from opd.serving.pool import ServerPool
    from opd.tracking.traces import Tracer
    from scripted import ScriptedClient, text_generator
    from third_env.echo import EchoEnv

    class Budgeted(EchoEnv):
        budget_fields = ("max_tokens", "eval_temperature")
        tool_schemas = math_prompt.TOOLS

    assert "__init__" not in vars(EchoEnv)
    item = {"id": "echo-0", "word": "apple"}
    cfg = validate(compose([f"hydra.searchpath=[file://{THIRD / 'conf'}]", "env=echo", "group_size=1", "env.max_tokens=12"]))
    policy = ScriptedClient(generate=text_generator(tokenizer, [("Apple.<|im_end|>", "stop")]))
    args, kwargs = build.environment_arguments(cfg, TaskSet(train=[item], eval=[item], source="test"), fixture_model,
                                               ServerPool([policy], 4, 1, backoff_s=0.01), Tracer.off())
    env = Budgeted(*args, **kwargs)
    try:
        group, _ = asyncio.run(env.collect_trajectories(item))
        parser = asyncio.run(env.parser.get())
    finally:
        asyncio.run(env.close())
    assert check_group(group) == [] and (group["generation_params"]["max_tokens"], group["generation_params"]["eval_temperature"]) == (12, 0.0)
    assert [tool.function.name for tool in parser.request.tools] == ["calculator", "python_interpreter"]
