"""One registry for every plug-in point (opd/registry.py): environments, sinks, loss terms, reward
signals and record rules. A name registered twice is refused where the second registers; a name
that is not there is one line naming the config key, the nearest name and every name there is;
an entry carries what it declares (a loss term: whether it needs teacher rows)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from conftest import compose
from opd.config import ConfigError, validate
from opd.registry import DuplicateName, Registry


def test_a_registry_refuses_a_name_twice_and_names_the_key_and_the_nearest_name_for_one_it_lacks() -> None:
    tools: Registry[int] = Registry("tool", "env.tools")
    tools.add("python", 1, jailed=True)
    tools.add("calculator", 2, jailed=False)
    with pytest.raises(DuplicateName, match="tool 'python' is registered twice"):
        tools.add("python", 3)
    assert tools.get("python") == 1 and tools.names == ["python", "calculator"]  # the first stays
    with pytest.raises(ConfigError, match=r"^env.tools: no tool named 'pyhton'; did you mean python\? \(tools: python, calculator\)$") as info:
        tools.get("pyhton")
    assert info.value.key == "env.tools"
    with pytest.raises(ConfigError, match=r"^env.tools: no tool named 'shell' \(tools: python, calculator\)$"):
        tools.get("shell")
    assert [e.name for e in tools.where(jailed=True)] == ["python"] and tools.meta("calculator", "jailed") is False


def test_every_plug_in_point_refuses_a_second_entry_of_a_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, the second silently replaced the first: a plug-in of yours named `mlflow` took the
    place of MLflow's sink, a second `correct` signal the math reward's own."""
    from opd.envs import registry as envs
    from opd.records import rules
    from opd.rewards import math as math_reward
    from opd.sinks import registry as sinks
    from opd.train import losses

    with pytest.raises(DuplicateName, match="sink 'mlflow' is registered twice"):
        sinks.sink_factory("mlflow")(lambda ctx: None)
    with pytest.raises(DuplicateName, match="loss term 'pg' is registered twice"):
        losses.loss_term("pg")(lambda x: x)
    with pytest.raises(DuplicateName, match="environment 'inline_math' is registered twice"):
        envs.ENVS.add("inline_math", envs.ENVS.get("opd_coding"))

    def correct(outcome: object, reward: object) -> float:
        return 1.0

    with pytest.raises(DuplicateName, match="reward signal 'correct' is registered twice"):
        math_reward.SIGNALS.add(correct)

    def tokens_are_lists(group: object) -> None:
        return None

    first = rules.RULES.names[0]
    tokens_are_lists.__name__ = first
    with pytest.raises(DuplicateName, match=f"record rule '{first}' is registered twice"):
        rules.rule("group")(tokens_are_lists)
    assert sinks.SINKS.get("mlflow") is sinks._mlflow and envs.ENVS.get("inline_math").name == "inline_math"


def test_a_mistyped_name_is_one_line_naming_its_key_and_the_nearest_name(fixture_model: str) -> None:
    from opd.build import preflight
    from opd.envs.registry import spec_of
    from opd.rewards.rubric import RubricError

    with pytest.raises(ConfigError, match=r"^sinks: no sink named 'mlfow'; did you mean mlflow\? \(sinks: mlflow, atropos, trainer, evaluation, parquet; "
                                          r"or package.module:factory\)$") as info:
        preflight(validate(compose(["sinks=[mlfow]"])), fixture_model)
    assert info.value.key == "sinks"
    with pytest.raises(ConfigError, match=r"^trainer.loss: no loss term named 'opd_advantge'; did you mean opd_advantage\?") as info:
        preflight(validate(compose(["trainer=local", "+trainer.loss.opd_advantge=0.5"])), fixture_model)
    assert info.value.key == "trainer.loss"
    with pytest.raises(ConfigError, match=r"^env.name: no environment named 'inline_maths'; did you mean inline_math\? \(environments: inline_math, "
                                          r"opd_coding; or env.spec=package.module:SPEC\)$"):
        spec_of({"name": "inline_maths"})
    from opd.rewards import math as math_reward
    from opd.rewards.rubric import Rubric

    weights = {**{name: 1.0 for name in math_reward.SIGNALS.names if name != "correct"}, "corect": 1.0}
    with pytest.raises(RubricError, match=r"unknown \['corect'\]; corect: did you mean correct\?\)$") as rubric_error:
        Rubric(math_reward.SIGNALS, weights)
    assert rubric_error.value.key == "reward.weights"


def test_a_loss_term_that_declares_it_needs_teacher_rows_is_refused_without_a_teacher(monkeypatch: pytest.MonkeyPatch) -> None:
    """Which terms need teacher rows is what each term declares where it is registered, not a
    set kept by hand beside them: a new one is checked like the built-in ones."""
    from opd.train import losses
    from opd.train.teacher_terms import check_loss_weights, teacher_terms

    assert teacher_terms() == ["opd_advantage", "topk_kl"]
    monkeypatch.setattr(losses, "LOSS_TERMS", losses.LOSS_TERMS.copy())

    @losses.loss_term("teacher_ce", needs_teacher=True)
    def teacher_ce(x: losses.LossInputs) -> object:
        return x.new_lp.sum() * 0

    assert teacher_terms() == ["opd_advantage", "topk_kl", "teacher_ce"]
    cfg = validate(compose(["arm=grpo"]))
    taught = SimpleNamespace(env=cfg.env, teacher=cfg.teacher, trainer=SimpleNamespace(loss={"pg": 0.0, "teacher_ce": 1.0}))
    with pytest.raises(ConfigError, match="trainer.loss: teacher_ce=1 needs teacher rows and env=inline_math without a teacher writes none"):
        check_loss_weights(taught, None)


def test_tools_are_registered_like_every_plug_in_a_name_twice_refused_a_near_miss_answered_with_the_nearest() -> None:
    """Before, a toolbox refused a duplicate with a bare ValueError and the module's tool lists
    took any name twice; a model's near-miss call named only the tools there are."""
    from opd.tools import math_tools, workspace
    from opd.tools.registry import Tool, Toolbox

    async def run(ctx: object, args: dict[str, str]) -> str:
        return args["expr"]

    twin = Tool("calculator", "Another calculator.", (("expr", "arithmetic"),), run)
    with pytest.raises(DuplicateName, match=r"^tool 'calculator' is registered twice: Tool of opd.tools.math_tools._calculator and Tool of "
                                            r"test_registry\..*\.run$"):
        math_tools.TOOLS.add("calculator", twin)
    with pytest.raises(DuplicateName, match="tool 'calculator' is registered twice"):
        Toolbox([twin, twin])
    assert math_tools.TOOLS.names == ["calculator", "python_interpreter"] and workspace.TOOLS.names == ["write_file", "read_file", "terminal", "patch"]
    box = Toolbox(math_tools.TOOLS)
    near = asyncio.run(box.run("calculater", {"expr": "1"}))
    assert (near.status, near.as_text()) == ("malformed", "error: unknown tool 'calculater'; did you mean calculator? available: calculator, python_interpreter")
    # A name near none reads as before; a known tool runs as before.
    assert asyncio.run(box.run("shell", {})).as_text() == "error: unknown tool 'shell'; available: calculator, python_interpreter"
    assert asyncio.run(Toolbox([twin]).run("calculator", {"expr": "2 + 3"})).as_text() == "2 + 3"
