"""The command line as a user meets it (opd/cli.py): a bad input is one line naming what was
typed and the nearest key or option, an unwritable run or sweep directory stops the command first,
`--help` lists the user's groups and knobs only, and other libraries' INFO lines stay in the log."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, one_fast
from opd.cli import ConsoleFilter, nearest, user_groups


def launch(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "experiments.launch", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(("args", "line"), [
    (["env.max_tool_cals=3"], "error: env.max_tool_cals=3: env.max_tool_cals is not a config key; did you mean env.max_tool_calls?"),
    (["env=inline_maths"], "error: env=inline_maths: no such option; did you mean env=inline_math? (env is one of: inline_math, opd_coding)"),
    (["model=qwen4"], "error: model=qwen4: no such option; did you mean model=qwen3?"),
    (["group_size=abc"], "error: group_size=abc: Value 'abc' of type 'str' could not be converted to Integer"),
    (["envv.temperature=1"], "error: envv.temperature=1: envv is not a config key; did you mean env?"),
    (["a=["], "error: cannot read the override:"),
    # Two choices that do not go together: the arm's file sets a key the chosen trainer lacks.
    (["arm=grpo", "trainer=atropos"],
     "error: arm=grpo sets trainer.loss, which trainer=atropos does not have; arm=grpo selects trainer=local: choose one of the two"),
])
def test_a_mistyped_input_is_one_line_naming_it_and_the_nearest(args: list[str], line: str) -> None:
    out = launch(*args)
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith(line) and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "_schema" not in out.stderr and "Traceback" not in out.stderr


def test_a_key_missing_from_a_files_own_group_is_not_called_a_clash_of_two_choices() -> None:
    from opd.cli import _clash

    error = "In '{}': ConfigKeyError raised while composing config:\nKey 'x' not in 'TrainerConfig'\n    full_key: trainer.x\n    object_type=TrainerConfig"
    assert _clash(error.format("trainer/local"), ["trainer=local"]) is None
    assert _clash(error.format("arm/grpo"), ["arm=grpo", "trainer=atropos"]).startswith("arm=grpo sets trainer.x, which trainer=atropos does not have")


@pytest.mark.parametrize(("args", "message"), [
    (["server=vllm"], "server.model must be set: server=vllm needs the model name its servers serve: server.model=NAME"),
    (["mode=trian"], "mode must be one of ['train', 'evaluate', 'serve'], got 'trian'; did you mean train?"),
])
def test_a_bad_value_is_one_logged_line_without_a_traceback(tmp_path: Path, args: list[str], message: str) -> None:
    out = launch(*args, f"output_root={tmp_path}")
    errors = [line for line in (out.stdout + out.stderr).splitlines() if "ERROR" in line]
    assert out.returncode == 2 and len(errors) == 1 and message in errors[0], out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr


@pytest.mark.parametrize("sweep", one_fast([True, False]))
def test_a_run_directory_that_cannot_be_made_stops_the_command_first(tmp_path: Path, sweep: bool) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    started = time.monotonic()
    out = launch(*(["-m", "seed=1,2"] if sweep else []), f"output_root={blocker}/out")
    assert out.returncode == 2, out.stdout + out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("error: output_root: cannot create ") and f"{blocker} is not a directory" in line
    assert ("hydra.sweep.dir=DIR" if sweep else "hydra.run.dir=DIR") in line
    assert time.monotonic() - started < 60
    # The key the user typed is the one named.
    out = launch(f"hydra.run.dir={blocker}/run")
    assert out.stderr.startswith("error: hydra.run.dir: cannot create"), out.stderr


def test_help_lists_the_users_groups_and_knobs_not_the_schemas() -> None:
    out = launch("--help", "env=opd_coding")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "_schema" not in text and "inline_math_default" not in text and "env/common" not in text
    for group in ("model", "env", "dataset", "reward", "server", "judge", "tracking", "runner", "trainer", "experiment", "hydra/launcher"):
        assert any(line.startswith(group + " ") for line in text.splitlines()), group
    assert "opd_coding*" in text and "fixture*" in text  # this command's choices are marked
    assert "distill_topk=20" in text and "output_root=outputs" in text  # knobs with their values
    assert "Teacher top-K per position" in text  # and their comments


def test_the_groups_listed_are_the_readmes() -> None:
    """`--help` and the configuration page's table (docs/configuration.md) name the same groups and options."""
    readme = (ROOT / "docs" / "configuration.md").read_text()
    for group, options in user_groups().items():
        row = next(line for line in readme.splitlines() if line.startswith(f"| `{group}` |"))
        assert all(f"`{option}`" in row for option in options), (group, options, row)


def test_nearest_names_a_close_word_only() -> None:
    assert nearest("max_tool_cals", ["max_tool_calls", "max_new_tokens"]) == "max_tool_calls"
    assert nearest("zzz", ["max_tool_calls"]) is None


def test_the_console_keeps_our_lines_and_everyones_warnings() -> None:
    keep = ConsoleFilter()

    def record(name: str, level: int, **extra: object) -> logging.LogRecord:
        made = logging.LogRecord(name, level, __file__, 1, "message", None, None)
        made.__dict__.update(extra)
        return made

    assert keep.filter(record("opd.experiment", logging.INFO)) and keep.filter(record("experiments.launch", logging.INFO))
    assert not keep.filter(record("vllm.triton_utils.importing", logging.INFO))
    assert not keep.filter(record("mlflow.process", logging.INFO)) and keep.filter(record("mlflow.process", logging.WARNING))
    assert not keep.filter(record("opd.experiment", logging.INFO, file_only=True))
