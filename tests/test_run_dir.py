"""A run directory nobody can turn against its owner (`opd.run_files`): every file a run opens,
creates, truncates or replaces in it refuses a symbolic link, a FIFO and a file with other names,
at once, with one line naming the path, and leaves the file they point at as it was.

The attack: a crafted run directory handed to `resume=true hydra.run.dir=...` whose groups.jsonl
links to a file of yours (resume cut it to 0 bytes) or is a FIFO (resume waited on it forever).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from opd.serving.weights import ServedWeights

from conftest import ROOT, compose
from helpers import make_group, sequence

# What a crafted directory puts where the run's file goes.
PLANTS = ["symlink", "fifo", "hardlink"]
SAID = {"symlink": "is a symbolic link", "fifo": "is a FIFO", "hardlink": "is a file with 2 hard links"}
# How long a refusal may take (it takes milliseconds; a reader waiting on a FIFO never returns).
WITHIN_S = 10.0


class Planted:
    """`path` made `how` (a link to, or another name of, `victim`, a file outside the run; or a
    FIFO); `unchanged()` says whether all is as it was."""

    def __init__(self, path: Path, how: str, victim: Path) -> None:
        self.path, self.how, self.victim = path, how, victim
        victim.write_bytes(b"your own data\n")
        self.before = (victim.read_bytes(), victim.stat().st_mtime_ns)
        path.parent.mkdir(parents=True, exist_ok=True)
        if how == "symlink":
            path.symlink_to(victim)
        elif how == "hardlink":
            os.link(victim, path)
        else:
            os.mkfifo(path)

    def unchanged(self) -> bool:
        still = {"symlink": self.path.is_symlink(), "hardlink": os.path.samefile(self.path, self.victim),
                 "fifo": self.path.exists() and not self.path.is_file() and os.stat(self.path).st_mode & 0o170000 == 0o010000}[self.how]
        return still and (self.victim.read_bytes(), self.victim.stat().st_mtime_ns) == self.before


def refused_in_time(call: Callable[[], Any], planted: Planted) -> BaseException:
    """The exception `call` raises, within WITHIN_S (a call left waiting on the FIFO fails the test;
    the FIFO is then opened from this side so that it returns)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as err:  # noqa: BLE001 - handed to the test
            outcome["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(WITHIN_S)
    if thread.is_alive():
        if planted.how == "fifo":  # let it go: a writer and a reader for whichever end it waits on
            for flags in (os.O_RDONLY | os.O_NONBLOCK, os.O_WRONLY | os.O_NONBLOCK):
                try:
                    os.close(os.open(planted.path, flags))
                except OSError:
                    pass
        thread.join(5)
        pytest.fail(f"still waiting on {planted.path} after {WITHIN_S:g} s")
    assert "error" in outcome, f"{planted.path} ({planted.how}) was used: {outcome.get('value')!r}"
    return outcome["error"]


def group(item: str) -> dict:
    return make_group([sequence([1, 2], [3, 4], [-0.1, -2.0])], [1.0], group_overrides={"item_id": item})


# ---- resume over a crafted run directory -----------------------------------------------------


@pytest.mark.parametrize("how", PLANTS)
def test_resume_over_a_crafted_groups_file_refuses_at_once_and_changes_nothing(tmp_path: Path, how: str) -> None:
    from opd.config import ConfigError
    from opd.experiment import resume_state

    out = tmp_path / "run"
    planted = Planted(out / "groups.jsonl", how, tmp_path / "yours.txt")
    cfg = compose(["env=inline_math", "resume=true", f"output_dir={out}", "tracking.enabled=false"])
    err = refused_in_time(lambda: resume_state(cfg, None, out), planted)
    assert isinstance(err, ConfigError) and str(err).startswith(f"resume: {out / 'groups.jsonl'} {SAID[how]};"), err
    assert "\n" not in str(err) and planted.unchanged() and sorted(p.name for p in out.iterdir()) == ["groups.jsonl"]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["symlink", "fifo"])
def test_the_launcher_refuses_resume_over_a_crafted_groups_file_in_seconds(tmp_path: Path, how: str) -> None:
    """The issue's attack through the real entry point: one line, exit 2, nothing changed."""
    out = tmp_path / "run"
    planted = Planted(out / "groups.jsonl", how, tmp_path / "yours.txt")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "experiments.launch", "env=inline_math", "resume=true", f"hydra.run.dir={out}",
                               "tracking.enabled=false", "runner.progress=false"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        pytest.fail(f"resume over a {how} groups.jsonl still runs after 180 s")
    took = time.monotonic() - started
    errors = [line for line in (done.stdout + done.stderr).splitlines() if "ERROR" in line or line.startswith("error")]
    assert done.returncode == 2 and len(errors) == 1 and f"{out / 'groups.jsonl'} {SAID[how]}" in errors[0], done.stdout + done.stderr
    assert planted.unchanged() and not (out / "config.yaml").exists() and took < 120, took


# ---- every file a run writes ------------------------------------------------------------------


class _Tokenizer:
    def __len__(self) -> int:
        return 10


class _EvalEnv:
    request_errors = 0
    served_weights = ServedWeights()

    async def evaluate(self, **kwargs: Any) -> Any:
        from opd.envs.base import EvalReport

        return EvalReport({"eval/accuracy": 1.0}, [{"item": "m-1", "correct": True}], [])


def _groups_file(run: Path) -> None:
    from opd.records import GroupWriter

    GroupWriter(run / "groups.jsonl")


def _viewer(run: Path) -> None:
    from opd.records import GroupWriter
    from opd.records.viewer import write_viewer

    with GroupWriter(run / "other.jsonl") as writer:
        writer.write(group("m-1"))
    write_viewer(run / "other.jsonl", _Tokenizer(), run / "groups.html")


def _log(run: Path) -> None:
    from opd.run_files import LogFile

    LogFile(str(run / "launch.log"))


def _hydra_config(run: Path) -> None:
    import hydra.core.utils as hydra_utils
    from omegaconf import OmegaConf

    from opd.cli import guard_hydra_files

    guard_hydra_files()
    hydra_utils._save_config(OmegaConf.create({"seed": 1}), "config.yaml", run / ".hydra")


def _config_yaml(run: Path) -> None:
    from opd.run_files import replace_file

    replace_file(run / "config.yaml", "seed: 1\n")


def _eval_rows(run: Path) -> None:
    from opd.config import EvalConfig
    from opd.sinks.evaluation import Evaluator

    asyncio.run(Evaluator(_EvalEnv(), EvalConfig(), 1, run, None).run(0))


def _checkpoint(run: Path) -> None:
    from opd.train.untied import save_untied

    save_untied(None, run / "weights")


def _server_log(run: Path) -> None:
    from opd.serving import local_vllm

    cfg = compose(["server=local"])

    def no_server(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("vLLM was started over a planted log")

    server = local_vllm.LocalVLLM(cfg.server, "fixture", run / "vllm")
    original, local_vllm.subprocess.Popen = local_vllm.subprocess.Popen, no_server
    try:
        server.start()
    finally:
        local_vllm.subprocess.Popen = original
        server.stop()


def _mlflow_run_file(run: Path) -> None:
    from opd.tracking.mlflow_run import previous_run_id

    previous_run_id(run, wait_s=1)


def _sweep_state(run: Path) -> None:
    from opd.sweep.state import SweepState, write_state

    write_state(SweepState(str(run), ["seed"]))


# name -> (the file planted, what writes or reads it)
WRITERS: dict[str, tuple[str, Callable[[Path], None]]] = {
    "groups.jsonl": ("groups.jsonl", _groups_file),
    "viewer": ("groups.html", _viewer),
    "launch.log": ("launch.log", _log),
    "hydra": (".hydra/config.yaml", _hydra_config),
    "config.yaml": ("config.yaml", _config_yaml),
    "evaluation": ("eval/step_000000.jsonl", _eval_rows),
    "checkpoint": ("weights/config.json", _checkpoint),
    "server.log": ("vllm/server.log", _server_log),
    "mlflow_run.json": ("mlflow_run.json", _mlflow_run_file),
    "sweep_state": ("opd_sweep.json", _sweep_state),
}


# Files a run only reads: another name of a file is no harm there (nothing is written through it).
READ_ONLY = {"mlflow_run.json"}


@pytest.mark.parametrize(("name", "how"), [(n, h) for n in WRITERS for h in PLANTS if not (h == "hardlink" and n in READ_ONLY)])
def test_every_file_a_run_writes_refuses_a_planted_link_fifo_or_hard_link(tmp_path: Path, name: str, how: str) -> None:
    from opd.run_files import RunFileError

    relative, writer = WRITERS[name]
    run = tmp_path / "run"
    planted = Planted(run / relative, how, tmp_path / "yours.txt")
    err = refused_in_time(lambda: writer(run), planted)
    assert isinstance(err, RunFileError) or isinstance(err.__cause__, RunFileError), repr(err)
    assert str(err if isinstance(err, RunFileError) else err.__cause__).startswith(f"{run / relative} {SAID[how]};"), err
    assert planted.unchanged()


@pytest.mark.parametrize("directory", ["eval", "vllm", ".hydra", "weights"])
def test_a_directory_of_the_run_planted_as_a_link_is_refused(tmp_path: Path, directory: str) -> None:
    from opd.run_files import RunFileError

    run = tmp_path / "run"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run.mkdir()
    (run / directory).symlink_to(elsewhere, target_is_directory=True)
    writer = {"eval": _eval_rows, "vllm": _server_log, ".hydra": _hydra_config, "weights": _checkpoint}[directory]
    with pytest.raises(RunFileError, match=f"{run / directory} is a symbolic link"):
        writer(run)
    assert list(elsewhere.iterdir()) == []


def test_the_sweep_progress_counts_past_a_fifo_without_waiting(tmp_path: Path) -> None:
    from opd.sweep.progress import _LineCounter

    os.mkfifo(tmp_path / "groups.jsonl")
    started = time.monotonic()
    assert _LineCounter(tmp_path / "groups.jsonl").count() == 0 and time.monotonic() - started < WITHIN_S


def test_a_run_file_replaced_whole_leaves_no_temporary_file_and_keeps_the_old_one_on_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from opd.run_files import replace_file

    path = tmp_path / "summary.json"
    replace_file(path, "{}")
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    with pytest.raises(OSError):
        replace_file(path, '{"a": 1}')
    assert path.read_text() == "{}" and [p.name for p in tmp_path.iterdir()] == ["summary.json"]
