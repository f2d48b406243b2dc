"""MLflow tracking: where a run goes (tracking.uri alone), the cheap store check, the run's
lifetime in its own process, and a shared `mlflow server` that concurrent sweep jobs log to.
All against MLflow's real stores: sqlite files and a real `mlflow server`."""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from conftest import ROOT, compose
from helpers import free_port, mlflow_serving
from opd.config import ConfigError, validate
from opd.tracking.mlflow_run import RunInfo, TrackingFailed, open_run
from opd.tracking.store import artifact_location, check_store

FIXTURE = ROOT / "opd" / "fixture" / "model"


def _tracking(*overrides: str):
    return validate(compose(["tracking.experiment=tracking_test", *overrides])).tracking


def _info(name: str = "run") -> RunInfo:
    return RunInfo(name=name, parent_run_id=None, experiment_id=None, tags={"env": "test"}, swept={}, dataset=None)


def _client(uri: str):
    import mlflow

    return mlflow.MlflowClient(uri)


def _only_run(uri: str, experiment: str = "tracking_test"):
    client = _client(uri)
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return client, run


# ---------------------------------------------------------------- where artifacts go

def test_the_uri_alone_decides_where_artifacts_go(tmp_path: Path) -> None:
    assert artifact_location(f"sqlite:///{tmp_path}/a/mlflow.db", None) == (tmp_path / "a" / "mlruns").as_uri()
    assert artifact_location("http://mlflow.example:5000", None) is None  # the server's own (proxied) store
    assert artifact_location("https://mlflow.example", None) is None
    assert artifact_location(f"file://{tmp_path}/store", None) is None  # a file store keeps them in its root
    # An explicit root wins; relative paths are made absolute, URIs kept.
    assert artifact_location(f"sqlite:///{tmp_path}/a/mlflow.db", "s3://bucket/runs") == "s3://bucket/runs"
    assert artifact_location("http://mlflow.example:5000", str(tmp_path / "chosen")) == (tmp_path / "chosen").as_uri()
    with pytest.raises(ConfigError, match="tracking.artifact_root: a postgresql store holds no artifacts") as info:
        artifact_location("postgresql://user@db/mlflow", None)
    assert info.value.key == "tracking.artifact_root"
    assert artifact_location("postgresql://user@db/mlflow", "s3://bucket/runs") == "s3://bucket/runs"


@pytest.mark.slow
def test_a_runs_experiment_is_of_mlflows_classic_kind_unless_its_kind_was_chosen(tmp_path: Path) -> None:
    """MLflow 3 opens an experiment without a kind in its GenAI view (traces, evaluations); the
    project's runs are classic machine learning: the experiment a run creates says so
    (`mlflow.experimentKind`, as the UI's own selector writes it), one made before without a kind
    gets it, and one whose kind its user chose keeps it."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = _client(uri)
    where = (tmp_path / "mlruns").as_uri()  # not MLflow's default, ./mlruns of the current directory
    old = client.create_experiment("made_before", artifact_location=where)
    chosen = client.create_experiment("chosen", artifact_location=where, tags={"mlflow.experimentKind": "genai_development"})
    for name in ("tracking_test", "made_before", "chosen"):
        (tmp_path / name).mkdir()
        with open_run(_tracking(f"tracking.uri={uri}", f"tracking.experiment={name}"), tmp_path / name, {"x": 1}, _info()) as tracker:
            tracker.begin()
    kinds = {e.name: e.tags.get("mlflow.experimentKind") for e in client.search_experiments()}
    assert kinds["tracking_test"] == kinds["made_before"] == "custom_model_development"
    assert kinds["chosen"] == "genai_development" and client.get_experiment(old).name == "made_before" and chosen


def test_links_into_the_mlflow_ui_are_at_the_stores_own_address_in_the_classic_view() -> None:
    """A tracking server serves its UI at its own address (any port, no credentials in the link); a
    sqlite store's UI is the one `mlflow ui` serves, named with the command beside it; `--ui` wins."""
    from opd.tracking.ui import compare_link, run_link, sweep_view, ui_base, ui_command, view_link

    assert ui_base("http://alice:secret@mlflow.lab:8080/prefix/") == "http://mlflow.lab:8080/prefix"
    assert ui_base("https://mlflow.lab") == "https://mlflow.lab" and ui_command("https://mlflow.lab", "https://mlflow.lab") is None
    assert ui_base("sqlite:////o/mlflow.db") == "http://127.0.0.1:5000"
    assert ui_command("sqlite:////o/mlflow.db", "http://127.0.0.1:5000") == "mlflow ui --backend-store-uri sqlite:////o/mlflow.db"
    assert ui_base("sqlite:////o/mlflow.db", "http://box:7000/") == "http://box:7000"
    assert ui_command("sqlite:////o/mlflow.db", "http://box:7000") == "mlflow ui --backend-store-uri sqlite:////o/mlflow.db --host box --port 7000"
    assert run_link("http://box:7000", "4", "abc") == "http://box:7000/#/experiments/4/runs/abc?workflowType=machine_learning"
    assert view_link("http://box:7000", "4", "mlflow.sharedViewState.abc") == (
        "http://box:7000/#/experiments/4/runs?viewStateShareKey=abc&workflowType=machine_learning")
    assert compare_link("http://box:7000", "4", ["a", "b"]) == (
        "http://box:7000/#/compare-runs?runs=%5B%22a%22%2C%22b%22%5D&experiments=%5B%224%22%5D&workflowType=machine_learning")
    # A sweep's saved view, in the envelope MLflow 3's UI reads from the experiment's tags.
    key, value = sweep_view("abc", "sweep x", ["reward.weights.correctness", "seed"], ["objective"])
    envelope = json.loads(value)
    state = json.loads(envelope["state"])
    assert key == "mlflow.sharedViewState.abc" and envelope["name"] == "sweep x" and isinstance(envelope["createdAt"], int)
    assert state["selectedColumns"] == ["params.`reward.weights.correctness`", "params.`seed`", "metrics.`objective`"]
    assert state["searchFilter"] == "tags.mlflow.parentRunId = 'abc'" and state["orderByKey"] == "metrics.`objective`" and state["orderByAsc"] is False


@pytest.mark.slow
def test_a_run_on_another_sqlite_file_keeps_its_artifacts_beside_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    uri = f"sqlite:///{tmp_path}/elsewhere/mlflow.db"
    out = tmp_path / "run"
    out.mkdir()
    (out / "groups.jsonl").write_text("{}\n")
    with open_run(_tracking(f"tracking.uri={uri}"), out, {"a": {"b": 1}}, _info()) as tracker:
        tracker.log_metrics({"reward/mean": 0.5}, step=1)
        tracker.log_artifact(out / "groups.jsonl", "data")
    client, run = _only_run(uri)
    assert run.info.status == "FINISHED" and run.data.params["a.b"] == "1" and run.data.metrics["reward/mean"] == 0.5
    assert run.info.artifact_uri.startswith((tmp_path / "elsewhere" / "mlruns").as_uri())
    stored = tmp_path / "elsewhere" / "mlruns" / run.info.run_id / "artifacts"  # as outputs/mlruns holds the default store's
    assert (stored / "data" / "groups.jsonl").read_text() == "{}\n" and (stored / "config.yaml").exists()
    assert not (tmp_path / "cwd" / "outputs").exists() and not (tmp_path / "cwd" / "mlruns").exists()


@pytest.mark.slow
def test_an_explicit_artifact_root_still_wins(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    with open_run(_tracking(f"tracking.uri={uri}", f"tracking.artifact_root={tmp_path / 'chosen'}"), tmp_path, {}, _info()):
        pass
    _, run = _only_run(uri)
    assert run.info.artifact_uri.startswith((tmp_path / "chosen").as_uri())
    assert (tmp_path / "chosen" / run.info.run_id / "artifacts" / "config.yaml").exists()
    assert not (tmp_path / "mlruns").exists()


# ---------------------------------------------------------------- the cheap check

class _NotMlflow(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_error(404)

    def log_message(self, *args: object) -> None:
        pass




def test_bad_stores_are_refused_quickly_without_mlflow(tmp_path: Path) -> None:
    not_a_db = tmp_path / "notes.db"
    not_a_db.write_text("these are not the tables you are looking for" * 100)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotMlflow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cases = [
            (f"sqlite:///{not_a_db}", "tracking.uri: cannot open the MLflow store"),
            (f"http://127.0.0.1:{free_port()}", "tracking.uri: cannot reach the MLflow server"),
            (f"http://127.0.0.1:{server.server_port}", "answers, but not as an MLflow tracking server"),
        ]
        for uri, message in cases:
            started = time.monotonic()
            with pytest.raises(ConfigError, match=message) as info:
                check_store(uri, None)
            assert info.value.key == "tracking.uri" and time.monotonic() - started < 5, uri
    finally:
        server.shutdown()
    check_store(f"sqlite:///{tmp_path}/new/mlflow.db", None)  # a new file in a new directory is fine
    # The check needs no MLflow for sqlite and http(s) (importing it takes seconds).
    probe = "import sys; from opd.tracking.store import check_store; check_store(sys.argv[1], None); print('mlflow' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", probe, f"sqlite:///{tmp_path}/mlflow.db"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "False", proc.stderr[-2000:]


# ---------------------------------------------------------------- the run's lifetime

def test_nothing_is_sent_before_begin_and_everything_after(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    with open_run(_tracking(f"tracking.uri={uri}"), tmp_path, {"x": 1}, _info()) as tracker:
        for step in range(1, 51):
            tracker.log_metrics({"m": float(step)}, step=step)
        assert tracker._process is None  # the run's requests go first: no MLflow process yet
        assert not (tmp_path / "mlflow_run.json").exists()
        tracker.begin()
        run_id = tracker.run_id
        assert (tmp_path / "mlflow_run.json").read_text().count(run_id) == 1
    client, run = _only_run(uri)
    assert run.info.run_id == run_id and run.info.status == "FINISHED"
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "m")] == [(s, float(s)) for s in range(1, 51)]
    assert tracker._process is not None and tracker._process.returncode == 0
    assert (tmp_path / "mlflow_run.json").exists() and not (tmp_path / "mlflow_process.pid").exists()  # ended: nothing to wait for


@pytest.mark.slow
def test_the_mlflow_run_keeps_the_runs_own_times_however_late_mlflow_opens_it(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The run started 30 s before it opened its MLflow run, logged two steps 1.5 s apart while
    MLflow was not even imported, and ended: the UI shows those times, not the tracking process's."""
    caplog.set_level("INFO", logger="mlflow.process")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    started = time.time() - 30
    info = RunInfo("timed", None, None, {"env": "test"}, {}, None, started=started,
                   source={"mlflow.source.name": "/repo/experiments/launch.py", "mlflow.source.type": "LOCAL", "opd.command": "python -m experiments.launch a=1"})
    resolved = {"a": 1, "output_root": str(tmp_path), "output_dir": str(tmp_path / "run")}
    logged = []
    with open_run(_tracking(f"tracking.uri={uri}"), tmp_path, resolved, info) as tracker:
        for step in (1, 2):
            tracker.log_metrics({"m": float(step)}, step=step)
            logged.append(time.time())
            time.sleep(1.5)
        assert tracker._process is None
        ended = time.time()
    client, run = _only_run(uri)
    assert run.info.start_time == int(started * 1000)
    assert abs(run.info.end_time / 1000 - ended) < 1.0
    stamps = [m.timestamp / 1000 for m in client.get_metric_history(run.info.run_id, "m")]
    assert stamps == [pytest.approx(t, abs=0.5) for t in logged]
    # The directories a run writes to are tags: params are what the run does.
    assert run.data.params["a"] == "1" and "output_dir" not in run.data.params and "output_root" not in run.data.params
    assert run.data.tags["output_root"] == str(tmp_path.resolve()) and run.data.tags["output_dir"] == str(tmp_path.resolve())
    # The source is the launcher, not the tracking process that made the calls.
    assert run.data.tags["mlflow.source.name"] == "/repo/experiments/launch.py" and run.data.tags["opd.command"] == "python -m experiments.launch a=1"
    assert run.info.run_name == "timed"
    # MLflow's own messages (a new store's tables) reach the run's log as `mlflow.process`, not the console.
    assert any(r.name == "mlflow.process" and "database tables" in r.getMessage() for r in caplog.records)


def test_runs_are_named_from_what_was_asked_and_secrets_stay_out() -> None:
    from opd.tracking.mlflow_run import run_title, source_tags

    asked = ["env=opd_coding", "distill_topk=20", "server=vllm", "server.base_urls=[http://h:8000/v1]", "server.api_key=hunter2",
             "tracking.uri=sqlite:///x.db", "hydra.run.dir=/r", "output_root=/o", "+reward.weights.correctness=0.5"]
    assert run_title("opd_coding", "fixture", asked) == "opd_coding fixture distill_topk=20 reward.weights.correctness=0.5"
    assert run_title("inline_math", "Qwen3-4B", []) == "inline_math Qwen3-4B"
    assert len(run_title("inline_math", "m", [f"seed={i}" for i in range(100)])) == 200
    tags = source_tags([str(ROOT / "experiments" / "launch.py"), "env=opd_coding", "server.api_key=hunter2", "judge.api_key=x"])
    assert tags["mlflow.source.name"] == str(ROOT / "experiments" / "launch.py")
    assert tags["opd.command"] == "python -m experiments.launch env=opd_coding server.api_key=*** judge.api_key=***"


def test_resume_does_not_wait_for_a_pid_that_is_no_longer_the_tracking_process(tmp_path: Path) -> None:
    from opd.tracking.mlflow_run import previous_run_id

    (tmp_path / "mlflow_run.json").write_text('{"run_id": "abc"}')
    for stale in (str(os.getpid()), "999999999", "not a pid", ""):  # reused by another program, gone, garbage
        (tmp_path / "mlflow_process.pid").write_text(stale)
        started = time.monotonic()
        assert previous_run_id(tmp_path, wait_s=30) == "abc"
        assert time.monotonic() - started < 5


@pytest.mark.slow
def test_a_failing_block_ends_failed_and_ctrl_c_ends_killed(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    with pytest.raises(ValueError):
        with open_run(_tracking(f"tracking.uri={uri}", "tracking.run_name=failing"), tmp_path, {}, _info("failing")):
            raise ValueError("the run's own error")
    with pytest.raises(KeyboardInterrupt):
        with open_run(_tracking(f"tracking.uri={uri}", "tracking.run_name=killed"), tmp_path, {}, _info("killed")) as tracker:
            tracker.begin()
            raise KeyboardInterrupt
    client = _client(uri)
    runs = client.search_runs([client.get_experiment_by_name("tracking_test").experiment_id])
    assert {r.info.run_name: r.info.status for r in runs} == {"failing": "FAILED", "killed": "KILLED"}


@pytest.mark.slow
def test_a_store_that_fails_after_the_check_fails_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")  # the tracking process's directory too
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = _client(uri)
    client.delete_experiment(client.create_experiment("tracking_test"))  # runs cannot start in it
    with pytest.raises(ConfigError, match="tracking.uri: cannot open the MLflow store") as info:
        with open_run(_tracking(f"tracking.uri={uri}"), tmp_path, {}, _info(), begin=True) as tracker:
            with pytest.raises(ConfigError):
                tracker.run_id  # noqa: B018 - waits for the opening
            tracker.log_metrics({"m": 1.0}, step=1)  # the next call raises it again
    assert "deleted" in str(info.value) or "active" in str(info.value)
    # The calls queued behind the failed opening were refused, not made in a run of MLflow's own
    # (the Default experiment, artifacts in ./mlruns of the current directory).
    assert client.search_runs(["0"]) == [] and not (tmp_path / "cwd" / "mlruns").exists()


@pytest.mark.slow
def test_a_failed_call_fails_the_run_at_its_next_call(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    with pytest.raises(TrackingFailed, match="log_artifact"):
        with open_run(_tracking(f"tracking.uri={uri}"), tmp_path, {}, _info(), begin=True) as tracker:
            tracker.log_artifact(tmp_path / "no-such-file.txt")
    _, run = _only_run(uri)
    assert run.info.status == "FAILED"


@pytest.mark.slow
def test_a_call_after_the_tracking_process_died_fails_at_once(tmp_path: Path) -> None:
    # Slurm's signals reach every process of a job: the tracking process may be gone before the
    # run's last calls (the sinks' uploads on the way out). Those must fail, not wait forever.
    import signal
    import threading

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    (tmp_path / "a.txt").write_text("a")
    with pytest.raises(TrackingFailed):
        with open_run(_tracking(f"tracking.uri={uri}"), tmp_path, {}, _info(), begin=True) as tracker:
            tracker.run_id  # opened
            tracker._process.send_signal(signal.SIGKILL)
            tracker._threads[-1].join(timeout=30)  # the reader saw the end
            failures: list[BaseException] = []

            def late_call() -> None:
                try:
                    tracker.log_artifact(tmp_path / "a.txt")
                except BaseException as err:  # noqa: BLE001 - the test reads it
                    failures.append(err)

            caller = threading.Thread(target=late_call, daemon=True)  # a daemon: a hang fails the test, not the session
            caller.start()
            caller.join(timeout=30)
            assert not caller.is_alive(), "a call after the tracking process died waited forever"
            assert len(failures) == 1 and isinstance(failures[0], TrackingFailed) and "exited" in str(failures[0])


KILLED_RUN = """
import os, signal, sys, time
from pathlib import Path
from opd.config import compose, validate
from opd.tracking.mlflow_run import RunInfo, open_run

out = Path(sys.argv[1])
tracking = validate(compose([f"output_dir={out}", f"tracking.uri=sqlite:///{out}/mlflow.db", "tracking.experiment=tracking_test"])).tracking
with open_run(tracking, out, {"x": 1}, RunInfo("killed", None, None, {}, {}, None), begin=True) as tracker:
    for step in range(1, 6):
        tracker.log_metrics({"m": float(step)}, step=step)
    time.sleep(0.5)  # the calls are in the pipe, the MLflow process is still importing
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_call_cut_off_by_the_runs_death_ends_the_session_as_killed() -> None:
    """A run killed while writing a call leaves half a pickle: the session stops as for a run
    that died (False: its MLflow run stays RUNNING for resume), instead of raising and letting
    MLflow's exit hook end the run FINISHED. No MLflow call is made for it."""
    import io
    import pickle

    from opd.tracking.session import serve

    whole = pickle.dumps(("log_params", ({"a": "x" * 5000},)))
    for cut in (1, len(whole) // 2, len(whole) - 1):
        assert serve(io.BytesIO(whole[:cut]), None) is False
    assert serve(io.BytesIO(b""), None) is False


@pytest.mark.slow
def test_a_killed_runs_tracking_process_still_records_the_run_for_resume(tmp_path: Path) -> None:
    from opd.tracking.mlflow_run import previous_run_id

    proc = subprocess.run([sys.executable, "-c", KILLED_RUN, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    run_id = previous_run_id(tmp_path)  # waits for the orphaned tracking process to finish
    assert run_id is not None
    client, run = _only_run(f"sqlite:///{tmp_path}/mlflow.db")
    assert run.info.run_id == run_id and run.info.status == "RUNNING"  # nothing could close it; resume continues it
    assert [m.step for m in client.get_metric_history(run_id, "m")] == [1, 2, 3, 4, 5]


# ---------------------------------------------------------------- a shared MLflow server

@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A real `mlflow server` (sqlite backend, artifacts served from its own directory) on a free
    port; its URL and directory. Stopped (its whole process group) afterwards."""
    root = tmp_path_factory.mktemp("mlflow_server")
    with mlflow_serving(["server", "--backend-store-uri", f"sqlite:///{root / 'server.db'}", "--artifacts-destination", str(root / "artifacts"),
                         "--workers", "2"], root) as url:
        yield url, root


@pytest.mark.slow
def test_a_run_on_a_server_uses_the_servers_artifact_store(mlflow_server, tmp_path: Path) -> None:
    url, root = mlflow_server
    (tmp_path / "notes.txt").write_text("kept by the server")
    with open_run(_tracking(f"tracking.uri={url}", "tracking.experiment=server_store"), tmp_path, {"x": 1}, _info()) as tracker:
        tracker.log_artifact(tmp_path / "notes.txt", "data")
    client, run = _only_run(url, "server_store")
    assert client.get_experiment(run.info.experiment_id).artifact_location.startswith("mlflow-artifacts:")
    assert (root / "artifacts" / run.info.experiment_id / run.info.run_id / "artifacts" / "data" / "notes.txt").read_text() == "kept by the server"
    assert not list((ROOT / "outputs").glob(f"mlruns/*/{run.info.run_id}"))


@pytest.mark.slow
def test_concurrent_sweep_jobs_lose_nothing_on_a_shared_server(mlflow_server, tmp_path: Path) -> None:
    """A joblib sweep, two jobs in two processes logging at once to the server (tracking.uri only),
    against the scripted inference server (inference behaviour does not matter here)."""
    import json

    from experiments.bench import scripted_server

    url, root = mlflow_server
    # One group at a time, 1 s per request: each job logs over 12+ s, so the two jobs log at once
    # even when one of them starts seconds later (the machine is shared).
    steps, sweep_dir = 12, tmp_path / "sweep"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    env.pop("MLFLOW_RUN_ID", None)
    with scripted_server(1.0) as infer:
        proc = subprocess.run([
            sys.executable, "-m", "experiments.launch", "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "env=inline_math",
            "server=vllm", f"server.model={FIXTURE}", f"server.base_urls=[{infer}]", "group_size=2", f"total_steps={steps}", "runner.groups_in_flight=1", "seed=0,1",
            "runner.progress=false", f"tracking.uri={url}", "tracking.experiment=shared_sweep", f"hydra.sweep.dir={sweep_dir}",
        ], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = _client(url)
    experiment = client.get_experiment_by_name("shared_sweep")
    assert experiment.artifact_location.startswith("mlflow-artifacts:")
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED" and parents[0].data.tags["opd.jobs"] == "2"
    assert len(children) == 2 and all(c.info.status == "FINISHED" for c in children)
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    assert {c.data.params["seed"] for c in children} == {"0", "1"}
    assert len({c.data.tags["opd.pid"] for c in children}) == 2  # two processes
    # They logged at once: the two runs, and the times their per-group metrics were logged, overlap.
    assert max(c.info.start_time for c in children) < min(c.info.end_time for c in children)
    logged = [[m.timestamp for m in client.get_metric_history(c.info.run_id, "reward/mean")] for c in children]
    assert max(min(t) for t in logged) < min(max(t) for t in logged)
    for child in children:
        run_id, out = child.info.run_id, Path(child.data.tags["output_dir"])
        groups = [json.loads(line) for line in (out / "groups.jsonl").read_text().splitlines()]
        assert len(groups) == steps
        # Every per-group metric arrived at every step, with the values of the groups on disk.
        per_group = [key for key in child.data.metrics if not key.startswith("summary/") and key != "objective"]
        assert "reward/mean" in per_group and "accuracy" in per_group
        for key in per_group:
            assert [m.step for m in client.get_metric_history(run_id, key)] == list(range(1, steps + 1)), key
        means = [m.value for m in client.get_metric_history(run_id, "reward/mean")]
        assert means == pytest.approx([sum(g["scores"]) / len(g["scores"]) for g in groups])
        assert child.data.metrics["summary/groups_written"] == steps
        # Every artifact arrived, through the server into its own store, byte for byte.
        listed = {a.path for a in client.list_artifacts(run_id)} | {a.path for a in client.list_artifacts(run_id, "data")}
        assert {"config.yaml", "data/groups.jsonl", "data/groups.html"} <= listed
        stored = root / "artifacts" / experiment.experiment_id / run_id / "artifacts"
        assert (stored / "data" / "groups.jsonl").read_bytes() == (out / "groups.jsonl").read_bytes()
        assert Path(client.download_artifacts(run_id, "data/groups.html", str(tmp_path))).read_bytes() == (out / "groups.html").read_bytes()
        assert len(child.data.params) > 50 and child.inputs.dataset_inputs
        assert not list((ROOT / "outputs").glob(f"mlruns/*/{run_id}"))
