"""Faults a long run meets: servers that go away, runs killed with SIGKILL or Ctrl-C, resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from procs import cmdline, descendants

from conftest import ROOT
from helpers import Proxy, launch, launch_process, lines, mlflow_run
from opd.records import check_group, read_groups
from opd.serving.watch import ServerLost

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _after_lines(path: Path, count: int, action, timeout: float = 300) -> threading.Thread:
    def wait() -> None:
        deadline = time.monotonic() + timeout
        while lines(path) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        action()

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    return thread


def _run_exists(tmp_path: Path) -> bool:
    # The run id the tracking process records once the run is open (read without MLflow: a client
    # opening the sqlite store while the run's process creates it would race its migrations).
    path = tmp_path / "run" / "mlflow_run.json"
    try:
        return bool(json.loads(path.read_text()).get("run_id"))
    except (OSError, ValueError):
        return False


def test_a_server_outage_is_waited_out_and_the_run_goes_on(tmp_path: Path, fixture_model: str, vllm_url: str) -> None:
    proxy = Proxy(vllm_url)
    try:
        def outage() -> None:
            proxy.down()
            time.sleep(4)
            proxy.up()

        waiter = _after_lines(tmp_path / "run" / "groups.jsonl", 2, outage)
        launch(tmp_path, fixture_model, proxy.url, ["env=inline_math", "total_steps=8", "group_size=2", "runner.groups_in_flight=2", "server.unreachable_timeout_s=60"])
        waiter.join()
    finally:
        proxy.close()
    groups = list(read_groups(tmp_path / "run" / "groups.jsonl"))
    assert len(groups) == 8 and all(not check_group(g) for g in groups)
    _, run = mlflow_run(tmp_path)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["summary/server_outages"] >= 1


def test_a_server_that_stays_down_ends_the_run_clearly(tmp_path: Path, fixture_model: str, vllm_url: str) -> None:
    proxy = Proxy(vllm_url)
    try:
        _after_lines(tmp_path / "run" / "groups.jsonl", 1, proxy.down)
        started = time.monotonic()
        with pytest.raises(ServerLost, match=r"unreachable for \d+ s \(server.unreachable_timeout_s=5\)"):
            launch(tmp_path, fixture_model, proxy.url, ["env=inline_math", "total_steps=50", "group_size=2", "runner.groups_in_flight=2", "server.unreachable_timeout_s=5"])
        assert time.monotonic() - started < 120
    finally:
        proxy.close()
    _, run = mlflow_run(tmp_path)
    assert run.info.status == "FAILED"
    written = list(read_groups(tmp_path / "run" / "groups.jsonl"))
    assert written and all(not check_group(g) for g in written)  # what was written stays valid


# Enough groups that the kill (after 3, with 3 in flight) lands mid-run.
STEPS = 20


def test_sigkill_loses_only_groups_in_flight_and_resume_finishes_the_run(tmp_path: Path, fixture_model: str, vllm_url: str) -> None:
    groups_path = tmp_path / "run" / "groups.jsonl"
    proc = launch_process(tmp_path, fixture_model, vllm_url, ["env=inline_math", f"total_steps={STEPS}", "group_size=2", "runner.groups_in_flight=3"])
    deadline = time.monotonic() + 300
    # The MLflow run is opened beside the first requests, not before them: under load a few groups
    # may be written first, so the kill waits for the run as well.
    while lines(groups_path) < 3 or not _run_exists(tmp_path):
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "stderr.log").read_text()[-3000:]
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # Every complete line is a valid group (a partial last line is all a kill may leave).
    data = groups_path.read_bytes()
    complete = data[: data.rfind(b"\n") + 1].decode().splitlines()
    assert 3 <= len(complete) < STEPS
    assert all(not check_group(json.loads(line)) for line in complete)
    client, run = mlflow_run(tmp_path)
    assert run.info.status == "RUNNING"  # nothing could close it
    run_id = run.info.run_id

    proc = launch_process(tmp_path, fixture_model, vllm_url, ["env=inline_math", f"total_steps={STEPS}", "group_size=2", "runner.groups_in_flight=3", "resume=true"])
    assert proc.wait(timeout=600) == 0, (tmp_path / "stderr.log").read_text()[-3000:]
    groups = list(read_groups(groups_path))
    assert len(groups) == STEPS and all(not check_group(g) for g in groups)
    items = [g["group_overrides"]["item_id"] for g in groups]
    assert len(set(items)) == STEPS  # no item done twice
    assert [json.loads(line) for line in complete] == groups[: len(complete)]  # kept as they were
    client, run = mlflow_run(tmp_path)
    assert run.info.run_id == run_id and run.info.status == "FINISHED"
    assert run.data.tags["opd.resumed_with_groups"] == str(len(complete))
    assert run.data.metrics["summary/groups_written"] == STEPS
    steps = sorted(m.step for m in client.get_metric_history(run_id, "reward/mean"))
    assert steps[-1] == STEPS and set(range(len(complete) + 1, STEPS + 1)) <= set(steps)


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "kill"])
def test_ctrl_c_or_kill_stops_cleanly_and_marks_the_run_killed(stop: signal.Signals, tmp_path: Path, fixture_model: str, vllm_url: str) -> None:
    groups_path = tmp_path / "run" / "groups.jsonl"
    proc = launch_process(tmp_path, fixture_model, vllm_url, ["env=inline_math", "total_steps=200", "group_size=2"])
    deadline = time.monotonic() + 300
    while lines(groups_path) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "stderr.log").read_text()[-3000:]
        time.sleep(0.05)
    proc.send_signal(stop)
    assert proc.wait(timeout=120) != 0
    client, run = mlflow_run(tmp_path)
    assert run.info.status == "KILLED"
    assert {a.path for a in client.list_artifacts(run.info.run_id, "data")} == {"data/groups.jsonl", "data/groups.html"}
    assert all(not check_group(g) for g in read_groups(groups_path))


def test_the_embedded_server_is_restarted_when_it_dies(tmp_path: Path, fixture_model: str) -> None:
    groups_path = tmp_path / "run" / "groups.jsonl"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    cmd = [
        # One group at a time, so that four groups still need the server when it is killed (with
        # more in flight they may all be generated already, and then no restart is needed).
        sys.executable, "-m", "experiments.launch", "env=inline_math", "total_steps=6", "group_size=2", "runner.groups_in_flight=1",
        "runner.progress=false", f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", f"tracking.artifact_root={tmp_path / 'mlruns'}", f"hydra.run.dir={tmp_path / 'run'}",
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=(tmp_path / "stderr.log").open("w"))
    deadline = time.monotonic() + 400
    while lines(groups_path) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "stderr.log").read_text()[-3000:]
        time.sleep(0.05)
    # Kill the vLLM API process under the launcher's guard, as an out-of-memory kill would.
    victims = [p for p in descendants(proc.pid) if "vllm.entrypoints.openai.api_server" in cmdline(p) and "guard.py" not in cmdline(p)]
    assert victims
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    assert proc.wait(timeout=600) == 0, (tmp_path / "stderr.log").read_text()[-3000:]
    groups = list(read_groups(groups_path))
    assert len(groups) == 6 and all(not check_group(g) for g in groups)
    _, run = mlflow_run(tmp_path)
    assert run.info.status == "FINISHED" and run.data.metrics["summary/server_restarts"] == 1
    assert "restarting it (1/2)" in (tmp_path / "run" / "launch.log").read_text()


