"""The command line as a user meets it (opd/cli.py): a bad input is one line naming what was
typed and the nearest key or option, an unwritable run or sweep directory stops the command first,
`--help` lists the user's groups and knobs only, and other libraries' INFO lines stay in the log."""

from __future__ import annotations

import logging
import os
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
def test_a_bad_value_is_one_error_line_without_a_traceback(tmp_path: Path, args: list[str], message: str) -> None:
    """The same style as a mistyped key (`error: ...` on stderr, status 2), also when the value is
    found once the run has its directory; the run's log keeps the line."""
    out = launch(*args, f"output_root={tmp_path}")
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.splitlines() == [f"error: {message}"], out.stderr
    assert "ERROR" not in out.stdout and "Traceback" not in out.stdout + out.stderr
    (log,) = tmp_path.glob("runs/*/*/launch.log")
    assert log.read_text().splitlines()[-1].endswith(f"error: {message}")


def _no_hub_env() -> dict[str, str]:
    """This machine as a user has it: no hub settings (the suite sets HF_HUB_OFFLINE=1), a hub
    that cannot be reached."""
    return {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"} | {"PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled"}


DEAD = "http://127.0.0.1:9/v1"  # a closed port: refused at once
# Every entry point, given a model, tokenizer, server or input it cannot use: (command, the line it
# starts with). Each is checked before any work starts.
ENTRY_POINTS = [
    (["experiments.launch", "model=qwen3", "server.model=Qwen/Qwen3-4B"], "error: server.model='Qwen/Qwen3-4B': the Hugging Face hub cannot be reached"),
    (["experiments.launch", "server=vllm", "server.model=fixture", f"server.base_urls=[{DEAD}]"], f"error: server.base_urls: nothing answers at {DEAD}"),
    (["opd.atropos.inline_math", "serve", "--openai.base_url", DEAD, "--env.tokenizer_name", "Qwen/Qwen3-4B"],
     "error: --env.tokenizer_name='Qwen/Qwen3-4B': the Hugging Face hub cannot be reached"),
    (["opd.atropos.opd_coding", "process", "--env.tokenizer_name=/no/such/model", "--env.total_steps", "2"],
     "error: --env.tokenizer_name='/no/such/model': no such directory"),
    (["opd.atropos.inline_math", "process", "--openai.base_url", DEAD, "--env.use_wandb", "false"], f"error: --openai.base_url: nothing answers at {DEAD}"),
    (["opd.atropos.inline_math", "process", "--env.opd_overrides", '["env.max_tool_cals=3"]', "--env.use_wandb", "false"],
     "error: --env.opd_overrides: env.max_tool_cals=3: env.max_tool_cals is not a config key; did you mean env.max_tool_calls?"),
    (["opd.records", "check", "/no/such/groups.jsonl"], "error: /no/such/groups.jsonl: no such file"),
    (["opd.records", "view", "{groups}", "--tokenizer", "Qwen/Qwen3-4B"], "error: --tokenizer='Qwen/Qwen3-4B' is not a directory nor a hub model"),
    (["opd.records", "view", "{groups}", "--out", "/no/such/dir/page.html"], "error: --out=/no/such/dir/page.html: no such directory"),
    (["experiments.compare", "{tmp}"], "error: {tmp}: not a tracked sweep directory"),
    (["experiments.compare", "0123abcd", "--tracking-uri", "http://127.0.0.1:9"], "error: --tracking-uri: cannot reach the MLflow server http://127.0.0.1:9"),
    (["experiments.compare", "0123abcd", "--tracking-uri", "sqlite:///{tmp}/none.db"], "error: --tracking-uri: no MLflow store at {tmp}/none.db"),
    (["experiments.compare", "{tmp}", "--ui", "localhost:5000"], "error: --ui='localhost:5000': give the UI's address"),
    (["experiments.bench", "e2e", "--url", DEAD], f"error: --url: nothing answers at {DEAD}"),
    (["experiments.bench", "overhead", "--set", "env.max_tool_cals=3"], "error: --set env.max_tool_cals=3: env.max_tool_cals is not a config key; did you mean env.max_tool_calls?"),
    (["experiments.bench", "startup", "--root", "{tmp}"], "error: --root='{tmp}': not a checkout of this project"),
    (["opd.records", "check", "--rerender", "--config", "/no/such/config.yaml", "{groups}"], "error: --config='/no/such/config.yaml': no such file"),
    (["opd.records", "check", "--rerender", "--tokenizer", "/no/such/model", "{groups}"], "error: --tokenizer='/no/such/model': no such directory"),
]


# One case of each entry point in the fast tier; the rest with the whole suite.
FAST_CASES = (0, 2, 6, 9, 13)


@pytest.mark.parametrize(("command", "line"), [pytest.param(*case, marks=() if i in FAST_CASES else pytest.mark.slow, id=" ".join(case[0][:2]) + f" #{i}")
                                               for i, case in enumerate(ENTRY_POINTS)])
def test_every_entry_point_stops_in_one_error_line_naming_what_it_cannot_use(tmp_path: Path, command: list[str], line: str) -> None:
    """One style everywhere: `error: <the option or input>: <what is wrong>` as the only line on
    stderr, status 2, no traceback, in seconds (an unreachable hub fails at its lookup, before
    transformers' minutes of retries; atroposlib's commands check before importing atroposlib)."""
    groups = tmp_path / "groups.jsonl"
    groups.write_text("")
    fill = {"{tmp}": str(tmp_path), "{groups}": str(groups)}
    for key, value in fill.items():
        command = [word.replace(key, value) for word in command]
        line = line.replace(key, value)
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", *command, *(["output_root=" + str(tmp_path)] if command[0] == "experiments.launch" else [])],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120, env=_no_hub_env())
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    said = out.stderr.splitlines()
    # The error is the last line and the only one (atroposlib may warn about its own defaults first).
    assert said and said[-1].startswith(line) and [s for s in said if "error" in s.lower()] == said[-1:], out.stderr[-3000:]
    if not command[0].startswith("opd.atropos"):
        assert len(said) == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stdout + out.stderr and "ERROR" not in out.stdout
    assert time.monotonic() - started < 30


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
