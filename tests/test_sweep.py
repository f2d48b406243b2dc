"""Sweeps: the MLflow parent/child wiring, its failure paths, experiments.compare, the UI's REST view."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from conftest import ROOT
from helpers import mlflow_serving
from opd.sweep.state import SweepState, job_label, read_state, run_name, shared_server_for, swept_keys, write_state


def test_swept_keys_come_from_sweep_overrides_and_sweeper_params() -> None:
    task = ["env=opd_coding", "reward.weights.correctness=0.5,0.7", "seed=range(0,2)", "total_steps=1"]
    assert swept_keys(task, {"reward.weights.efficiency": "0.1,0.2"}) == [
        "reward.weights.correctness", "seed", "reward.weights.efficiency",
    ]
    assert swept_keys(["a=1"], None) == []


def test_job_names_say_what_was_swept() -> None:
    values = job_label(["env=opd_coding", "reward.weights.correctness=0.7", "reward.weights.efficiency=0.1"],
                       ["reward.weights.correctness", "reward.weights.efficiency"])
    assert values == {"reward.weights.correctness": "0.7", "reward.weights.efficiency": "0.1"}
    assert run_name(values) == "correctness=0.7,efficiency=0.1"
    # Colliding last components keep the full key.
    assert run_name({"env.temperature": "1", "judge.temperature": "0", "seed": "3"}) == "env.temperature=1,judge.temperature=0,seed=3"
    assert run_name({}) == "job"
    assert run_name({"reward.weights.correctness": "0.6841694527491273", "dataset.path": "/data/a.b.jsonl"}) == "correctness=0.6842,path=/data/a.b.jsonl"


def test_state_round_trips_and_a_job_uses_the_shared_server_only_when_it_fits(tmp_path: Path) -> None:
    from tests.conftest import compose
    from opd.config import validate
    from opd.sweep.state import server_settings

    server = validate(compose(["distill_topk=5", "server.max_logprobs=5"])).server
    state = SweepState(sweep_dir=str(tmp_path), swept=["seed"], server_urls=["http://127.0.0.1:1/v1"],
                       server_settings={**server_settings(server), "max_logprobs": 20})
    write_state(state)
    assert read_state(tmp_path) == state
    assert read_state(tmp_path / "missing") is None
    assert shared_server_for(state, server) == ["http://127.0.0.1:1/v1"]  # asks top-5 of a top-20 server
    bigger = validate(compose(["distill_topk=30", "server.max_logprobs=30"])).server
    assert shared_server_for(state, bigger) is None
    other = validate(compose(["server.max_model_len=2048"])).server
    assert shared_server_for(state, other) is None
    assert shared_server_for(None, server) is None


def test_a_sweep_knows_how_many_jobs_it_runs() -> None:
    from opd.sweep.state import count_jobs

    basic = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
    assert count_jobs(["reward.weights.correctness=0.5,0.7,0.9", "reward.weights.efficiency=0.1,0.2", "env=opd_coding"], basic, None, None) == 6
    assert count_jobs(["seed=range(0,4)"], basic, {"env.temperature": "0.6,1.0"}, None) == 8
    assert count_jobs([], "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper", {"x": "interval(0, 1)"}, 8) == 8
    assert count_jobs(["seed=1,2"], "some.other.Sweeper", None, None) is None


def test_each_job_says_where_the_sweep_is(tmp_path: Path) -> None:
    from opd.sweep.progress import SUMMARY_FILE, job_line

    state = SweepState(sweep_dir=str(tmp_path), swept=["seed"], jobs=6, started=1000.0)
    assert job_line(state, 0, now=1010.0) == "sweep job 1 of 6 (none done yet)"
    for num in (0, 1):
        (tmp_path / str(num)).mkdir()
        (tmp_path / str(num) / SUMMARY_FILE).write_text("{}")
    # 2 jobs in 240 s: 4 more take 480 s.
    assert job_line(state, 2, now=1240.0) == "sweep job 3 of 6 (2 done in 4 min, ETA 8 min)"
    assert job_line(SweepState(sweep_dir=str(tmp_path), swept=[], started=1000.0), 2, now=1030.0) == "sweep job 3 (2 done in 30 s)"


def test_parallel_jobs_share_one_progress_bar_that_counts_every_jobs_groups(tmp_path: Path) -> None:
    from opd.sweep.progress import SUMMARY_FILE, SweepProgress

    progress = SweepProgress(tmp_path, jobs=2, steps=3, every_s=0.05)
    try:
        for num, lines in ((0, 3), (1, 1)):
            (tmp_path / str(num)).mkdir()
            with (tmp_path / str(num) / "groups.jsonl").open("a") as handle:
                handle.write("{}\n" * lines)
        (tmp_path / "0" / SUMMARY_FILE).write_text("{}")
        deadline = time.monotonic() + 10
        while progress.bar.n != 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert progress.bar.n == 4 and progress.bar.total == 6
        with (tmp_path / "1" / "groups.jsonl").open("a") as handle:  # only what is appended is read again
            handle.write("{}\n{}\n")
    finally:
        progress.stop()
    assert progress.bar.n == 6 and "jobs done 1/2" in str(progress.bar.postfix)


def test_compare_says_when_every_job_tied() -> None:
    from experiments.compare import Sweep

    def sweep(*objectives: float) -> Sweep:
        rows = [{"run": f"seed={i}", "objective": value, "run_id": str(i)} for i, value in enumerate(objectives)]
        return Sweep("p", "1", "sqlite:///x.db", ["seed"], rows, [r["run_id"] for r in rows], "accuracy")

    assert sweep(0.0, 0.0, 0.0).tie() == 0.0
    assert sweep(0.5, 0.25).tie() is None
    assert sweep(0.5).tie() is None  # one job ties with nothing
    assert sweep(float("nan"), float("nan")).tie() is None  # no objective at all is not a tie


def test_sweep_seeds_runs_every_point_with_each_seed_and_refuses_a_second_way_to_sweep_them() -> None:
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import open_dict, read_write

    from opd.config import ConfigError, compose
    from opd.sweep.callback import SweepCallback

    def config(task: list[str]):
        cfg = compose(["seed=3"], hydra=True)
        with read_write(cfg), open_dict(cfg):
            cfg.hydra.overrides.task = task
        return cfg

    cfg = config(["env.temperature=0.5,1.0", "seed=3", "total_steps=1"])
    SweepCallback._sweep_seeds(cfg, seed=3, seeds=2)
    task = list(cfg.hydra.overrides.task)
    assert task == ["env.temperature=0.5,1.0", "total_steps=1", "seed=3,4"]
    (jobs,) = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(task), None)
    assert sorted((j[0], j[2]) for j in jobs) == [("env.temperature=0.5", "seed=3"), ("env.temperature=0.5", "seed=4"),
                                                  ("env.temperature=1.0", "seed=3"), ("env.temperature=1.0", "seed=4")]
    assert swept_keys(task, None) == ["env.temperature", "seed"]
    with pytest.raises(ConfigError, match="sweep.seeds: seed is swept already"):
        SweepCallback._sweep_seeds(config(["env.temperature=0.5,1.0", "seed=0,1"]), seed=0, seeds=2)
    optuna = config(["env.temperature=0.5,1.0"])
    with read_write(optuna), open_dict(optuna):
        optuna.hydra.sweeper._target_ = "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"
    with pytest.raises(ConfigError, match="sweep.seeds: runs every point of a grid"):
        SweepCallback._sweep_seeds(optuna, seed=0, seeds=2)


def test_compare_gives_each_points_mean_and_spread_over_seeds_and_says_whether_the_best_is_told_apart() -> None:
    from experiments.compare import Sweep, points, separation

    def sweep(objectives: dict[str, list[float]]) -> Sweep:
        rows = [{"run": f"w={w},seed={i}", "status": "FINISHED", "reward.weights.x": w, "seed": str(i), "objective": value}
                for w, values in objectives.items() for i, value in enumerate(values)]
        rows.append({"run": "w=9,seed=0", "status": "FAILED", "reward.weights.x": "9", "seed": "0", "objective": 5.0})  # never counted
        return Sweep("p", "e", "uri", ["reward.weights.x", "seed"], rows, [])

    close = points(sweep({"-2": [0.50, 0.42, 0.47], "-0.5": [0.45, 0.40, 0.49]}))
    assert [r["reward.weights.x"] for r in close] == ["-2", "-0.5"] and [r["seeds"] for r in close] == [3, 3]
    assert close[0]["objective_mean"] == pytest.approx(0.46333, abs=1e-4) and close[0]["objective_sd"] == pytest.approx(0.04041, abs=1e-4)
    assert (close[0]["objective_min"], close[0]["objective_max"]) == (0.42, 0.50)
    assert "NOT told apart" in separation(close)
    apart = points(sweep({"-2": [0.60, 0.61, 0.62], "-0.5": [0.40, 0.41, 0.39]}))
    assert "p = " in separation(apart) and "NOT" not in separation(apart)
    single = points(sweep({"-2": [0.5], "-0.5": [0.4]}))
    assert "one seed per point cannot tell it from noise" in separation(single)
    assert points(Sweep("p", "e", "uri", ["reward.weights.x"], [{"run": "a", "status": "FINISHED", "reward.weights.x": "1", "objective": 1.0}], [])) == []


@pytest.mark.vllm
@pytest.mark.slow
def test_a_sweep_with_seeds_runs_each_point_per_seed_and_compare_shows_the_spread(tmp_path: Path, fixture_model: str, vllm_url: str) -> None:
    proc, sweep_dir, uri = _sweep(tmp_path, fixture_model, vllm_url, [
        "env=inline_math", "env.temperature=0.7,1.0", "sweep.seeds=2", "seed=5", "total_steps=1", "group_size=2",
    ])
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, parents, children = _runs(uri)
    assert parents[0].data.tags["opd.swept"] == "env.temperature,seed"
    assert sorted((c.data.params["env.temperature"], c.data.params["seed"]) for c in children) == [
        ("0.7", "5"), ("0.7", "6"), ("1.0", "5"), ("1.0", "6")]
    assert sorted(c.info.run_name for c in children) == ["temperature=0.7,seed=5", "temperature=0.7,seed=6", "temperature=1.0,seed=5", "temperature=1.0,seed=6"]
    compared = subprocess.run([sys.executable, "-m", "experiments.compare", str(sweep_dir)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert compared.returncode == 0, compared.stderr[-2000:]
    assert "per sweep point, over its seeds:" in compared.stdout and "best minus runner-up" in compared.stdout
    with (sweep_dir / "compare_points.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert sorted(r["env.temperature"] for r in rows) == ["0.7", "1.0"] and all(r["seeds"] == "2" for r in rows)


# ---------------------------------------------------------------- real sweeps (subprocesses)

def _sweep(tmp_path: Path, fixture_model: str, url: str | None, args: list[str]) -> tuple[subprocess.CompletedProcess, Path, str]:
    """Run a sweep in a subprocess (url None: the embedded default server) with its store under tmp_path."""
    store = tmp_path / "mlflow.db"
    sweep_dir = tmp_path / "sweep"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    env.pop("MLFLOW_RUN_ID", None)
    server = ["server=vllm", f"server.model={fixture_model}", f"server.base_urls=[{url}]"] if url else []
    cmd = [
        sys.executable, "-m", "experiments.launch", "-m", *server, "runner.progress=false", f"tracking.uri=sqlite:///{store}",
        f"tracking.artifact_root={tmp_path / 'mlruns'}", f"hydra.sweep.dir={sweep_dir}", *args,
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    return proc, sweep_dir, f"sqlite:///{store}"


def _runs(uri: str):
    import mlflow

    client = mlflow.MlflowClient(uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments, max_results=1000)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    return client, parents, children


SWEPT = ["reward.weights.correctness", "reward.weights.efficiency"]


@pytest.fixture(scope="module")
def basic_sweep(tmp_path_factory: pytest.TempPathFactory, fixture_model: str):
    """The README's sweep, as a user runs it (embedded default server), made small."""
    tmp_path = tmp_path_factory.mktemp("basic_sweep")
    proc, sweep_dir, uri = _sweep(tmp_path, fixture_model, None, [
        "env=opd_coding", "reward.weights.correctness=0.5,0.7,0.9", "reward.weights.efficiency=0.1,0.2",
        "total_steps=2", "group_size=2", "env.max_turns=3", "judge_votes=1",
    ])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return sweep_dir, uri


@pytest.mark.vllm
@pytest.mark.slow
def test_readme_sweep_nests_six_named_children_under_one_finished_parent(basic_sweep) -> None:
    sweep_dir, uri = basic_sweep
    client, parents, children = _runs(uri)
    assert len(parents) == 1 and len(children) == 6
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["opd.sweep_dir"] == str(sweep_dir.resolve())
    assert parent.data.tags["opd.swept"] == ",".join(SWEPT)
    assert parent.data.tags["opd.jobs"] == "6"
    names = set()
    for child in children:
        assert child.info.status == "FINISHED"
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        correctness, efficiency = (child.data.params[key] for key in SWEPT)
        assert child.info.run_name == f"correctness={correctness},efficiency={efficiency}"
        names.add(child.info.run_name)
        # The objective is the groups' mean accuracy (never the reward the swept weights scale).
        assert child.data.metrics["objective"] == pytest.approx(sum(m.value for m in client.get_metric_history(child.info.run_id, "accuracy")) / 2)
        assert len(client.get_metric_history(child.info.run_id, "reward/mean")) == 2
        assert len(client.get_metric_history(child.info.run_id, "opd/hint_rate")) == 2
        # The dataset is the run's input; system tags say where and with what it ran.
        (dataset_input,) = child.inputs.dataset_inputs
        assert dataset_input.dataset.name == "coding_builtin" and dataset_input.dataset.digest
        assert child.data.tags["version.mlflow"] and child.data.tags["git_commit"]
    assert len(names) == 6
    assert read_state(sweep_dir).parent_run_id == parent.info.run_id
    # One server for the whole sweep: started in the sweep dir, none in the jobs' dirs.
    assert (sweep_dir / "vllm" / "server.log").exists()
    assert not list(sweep_dir.glob("*/vllm"))


@pytest.mark.vllm
@pytest.mark.slow
def test_compare_prints_the_table_writes_csv_and_plot_and_logs_them(basic_sweep) -> None:
    sweep_dir, uri = basic_sweep
    proc = subprocess.run([sys.executable, "-m", "experiments.compare", str(sweep_dir)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:4] == ["run", "status", *SWEPT]
    assert "objective" in lines[0]
    assert all("FINISHED" in line for line in lines[2:8])
    with (sweep_dir / "compare.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    objectives = [float(r["objective"]) for r in rows]
    assert len(rows) == 6 and objectives == sorted(objectives, reverse=True)
    assert (sweep_dir / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "#/compare-runs?runs=" in proc.stdout and "mlflow ui --backend-store-uri" in proc.stdout
    client, parents, _ = _runs(uri)
    logged = {a.path for a in client.list_artifacts(parents[0].info.run_id, "compare")}
    assert logged == {"compare/compare.csv", "compare/compare.png"}


def _get(url: str, **query: str):
    with urllib.request.urlopen(f"{url}?{urllib.parse.urlencode(query)}" if query else url, timeout=30) as resp:
        return json.loads(resp.read())


def _post(url: str, body: dict):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


@pytest.mark.vllm
@pytest.mark.slow
def test_a_real_mlflow_server_shows_the_sweep_as_the_ui_does(basic_sweep, tmp_path: Path) -> None:
    sweep_dir, uri = basic_sweep
    with mlflow_serving(["server", "--backend-store-uri", uri, "--workers", "1"], tmp_path) as base:
        experiments = _post(f"{base}/api/2.0/mlflow/experiments/search", {"max_results": 100})["experiments"]
        ids = [e["experiment_id"] for e in experiments]
        runs = _post(f"{base}/api/2.0/mlflow/runs/search", {"experiment_ids": ids, "max_results": 100})["runs"]
        tags = [{t["key"]: t["value"] for t in r["data"].get("tags", [])} for r in runs]
        parents = [r for r, t in zip(runs, tags) if "mlflow.parentRunId" not in t]
        assert len(parents) == 1
        parent_id = parents[0]["info"]["run_id"]
        children = [r for r, t in zip(runs, tags) if t.get("mlflow.parentRunId") == parent_id]
        assert len(children) == 6
        for child in children:
            params = {p["key"]: p["value"] for p in child["data"]["params"]}
            assert set(SWEPT) <= set(params)
            run_id = child["info"]["run_id"]
            history = _get(f"{base}/api/2.0/mlflow/metrics/get-history", run_id=run_id, metric_key="reward/mean")["metrics"]
            assert [m["step"] for m in history] == [1, 2]
            files = {f["path"] for f in _get(f"{base}/api/2.0/mlflow/artifacts/list", run_id=run_id, path="data")["files"]}
            assert files == {"data/groups.jsonl", "data/groups.html"}


@pytest.mark.vllm
@pytest.mark.slow
def test_joblib_sweep_in_separate_processes_fails_the_parent_when_a_job_fails(tmp_path: Path, fixture_model: str, vllm_url: str) -> None:
    # total_steps=0 is a bad value: that job fails; the other two still run in their own processes.
    proc, sweep_dir, uri = _sweep(tmp_path, fixture_model, vllm_url, [
        "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "env=inline_math", "group_size=2", "total_steps=1,0,2",
    ])
    assert proc.returncode != 0
    assert "total_steps must be >= 1, got 0" in proc.stderr
    _, parents, children = _runs(uri)
    assert [p.info.status for p in parents] == ["FAILED"]
    assert sorted(c.info.run_name for c in children) == ["total_steps=1", "total_steps=2"]
    assert all(c.info.status == "FINISHED" for c in children)
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    # The jobs ran in worker processes, not the launcher's: the parent id reached them through the sweep dir.
    launcher_pid = parents[0].data.tags["opd.launcher_pid"]
    assert all(c.data.tags["opd.pid"] != launcher_pid for c in children)
    assert (sweep_dir / "0" / "groups.jsonl").exists() and (sweep_dir / "2" / "groups.jsonl").exists()


@pytest.mark.slow
def test_a_sweep_whose_tracking_cannot_work_stops_before_any_job(tmp_path: Path, fixture_model: str) -> None:
    # Hydra only warns when a callback raises and would run every job unlogged: the sweep stops first, in one line.
    proc, sweep_dir, _ = _sweep(tmp_path, fixture_model, "http://127.0.0.1:9/v1", ["env=inline_math", "seed=0,1", "tracking.uri=bogus-scheme://nowhere"])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert line.startswith("error: tracking.uri: ") and "bogus-scheme://nowhere" in line
    assert "Traceback" not in proc.stderr and not list(sweep_dir.glob("*/launch.log"))  # no job ran


def test_the_callback_pickles_without_its_live_objects() -> None:
    import pickle
    import threading

    from opd.sweep.callback import SweepCallback

    callback = SweepCallback()
    callback.server = threading.Lock()  # stands in for the server process / MLflow client
    callback.state = SweepState(sweep_dir="/x", swept=[])
    copy = pickle.loads(pickle.dumps(callback))
    assert copy.server is None and copy.state is None and copy.client is None


@pytest.mark.slow
def test_a_parallel_sweep_as_its_user_sees_it_in_the_console_and_mlflow(tmp_path: Path, fixture_model: str) -> None:
    """Three jobs, two at a time (joblib), against the scripted server: one progress bar, each job's
    place in the sweep, named runs with their own durations, and a parent that shows the sweep."""
    from experiments.bench import scripted_server

    with scripted_server(0.01) as url:
        proc, sweep_dir, uri = _sweep(tmp_path, fixture_model, url, [
            "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "env=inline_math", "group_size=2", "total_steps=2", "seed=1,2,3",
            "runner.progress=true",
        ])
    assert proc.returncode == 0, proc.stderr[-3000:]
    console = proc.stdout + proc.stderr
    assert "sweep job 3 of 3" in console and not re.search(r"groups:\s+\d+%", console)  # no per-job bars drawing over each other
    assert re.search(r"sweep: 100%\|.*\| 6/6 .*jobs done 3/3", console), console[-2000:]
    client, parents, children = _runs(uri)
    (parent,) = parents
    assert parent.info.run_name == "sweep inline_math fixture group_size=2 total_steps=2 seed=1,2,3"
    assert parent.data.tags["mlflow.source.name"].endswith("experiments/launch.py") and parent.data.tags["opd.jobs_planned"] == "3"
    by_job = {}
    for child in children:
        summary = json.loads((Path(child.data.tags["output_dir"]) / "summary.json").read_text())
        # The run lasted as long as the job did (not the instant the tracking process took; run_s
        # also counts waiting for that process to make its last calls).
        assert 0.6 * summary["run_s"] < (child.info.end_time - child.info.start_time) / 1000 <= summary["run_s"] + 1
        stamps = [m.timestamp for m in client.get_metric_history(child.info.run_id, "reward/mean")]
        assert all(child.info.start_time <= t <= child.info.end_time for t in stamps)
        assert "output_dir" not in child.data.params and child.data.tags["mlflow.source.name"].endswith("experiments/launch.py")
        by_job[int(Path(child.data.tags["output_dir"]).name)] = child.data.metrics["objective"]
    # Each job's objective on the parent, at its job number; the outcome at the end.
    history = {m.step: m.value for m in client.get_metric_history(parent.info.run_id, "objective")}
    assert history == by_job and sorted(history) == [0, 1, 2]
    metrics = parent.data.metrics
    assert metrics["jobs/finished"] == 3 and metrics["jobs/failed"] == 0
    assert metrics["objective/max"] == max(by_job.values()) and metrics["objective/min"] == min(by_job.values())


# The launcher with one defect planted in every job, inside its MLflow run (a test double: what is
# under test is how the sweep reports a failed job, whatever failed).
_FAILING_JOBS = """
import runpy, sys
import opd.build as build

def tracer(cfg, tracker):
    raise RuntimeError(f"boom in the job with seed {cfg.seed}")

build.tracer = tracer
build.preflight = lambda cfg, model: None  # no server to ask
sys.argv = [sys.argv[0], *sys.argv[1:]]
runpy.run_module("experiments.launch", run_name="__main__", alter_sys=True)
"""


@pytest.mark.slow
def test_a_failed_sweep_job_says_why_at_once_in_its_console_line_its_log_and_its_run(tmp_path: Path, fixture_model: str) -> None:
    """Hydra's basic launcher raises a job's error only after the whole sweep (with a traceback);
    each job now says why it failed when it fails: one `error:` line on the console before the next
    job starts, the same line last in its launch.log (the traceback above it), its reason on its
    MLflow run; the sweep ends with that line and status 1, no traceback on the console."""
    store, sweep_dir = tmp_path / "mlflow.db", tmp_path / "sweep"
    cmd = [sys.executable, "-c", _FAILING_JOBS, "-m", "seed=1,2", "env=inline_math", "server=vllm", f"server.model={fixture_model}",
           "server.base_urls=[http://127.0.0.1:9/v1]", "runner.progress=false", f"tracking.uri=sqlite:///{store}",
           f"tracking.artifact_root={tmp_path / 'mlruns'}", f"hydra.sweep.dir={sweep_dir}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    console = proc.stdout.splitlines()
    assert proc.returncode == 1, proc.stdout[-3000:]
    errors = [i for i, line in enumerate(console) if line.startswith("error:")]
    said = [console[i] for i in errors]
    assert len(said) == 3, proc.stdout[-3000:]
    first = f"error: sweep job 1 of 2 (seed=1) failed: RuntimeError: boom in the job with seed 1 (traceback in {sweep_dir / '0' / 'launch.log'})"
    assert said[0] == first and said[1].startswith("error: sweep job 2 of 2 (seed=2) failed: RuntimeError: boom in the job with seed 2")
    assert said[2] == first  # the sweep's end: the first failure, one line
    second_job = next(i for i, line in enumerate(console) if "sweep job 2 of 2" in line)
    assert errors[0] < second_job, proc.stdout[-3000:]  # at once, not after the sweep
    assert "Traceback" not in proc.stdout
    log = (sweep_dir / "0" / "launch.log").read_text()
    assert log.splitlines()[-1].endswith(first) and "Traceback" in log
    client, (parent,), children = _runs(f"sqlite:///{store}")
    assert sorted(c.data.tags.get("opd.error") for c in children) == ["RuntimeError: boom in the job with seed 1", "RuntimeError: boom in the job with seed 2"]
    assert all(c.info.status == "FAILED" for c in children)
    # The sweep in MLflow's UI: an experiment of the classic kind, with a saved view of the jobs'
    # runs whose columns are the swept keys and the objective, and its link on the console.
    experiment = client.get_experiment(parent.info.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    view = json.loads(experiment.tags[f"mlflow.sharedViewState.{parent.info.run_id}"])
    assert view["name"] == parent.info.run_name
    assert json.loads(view["state"])["selectedColumns"] == ["params.`seed`", "metrics.`objective`"]
    assert f"#/experiments/{experiment.experiment_id}/runs?viewStateShareKey={parent.info.run_id}&workflowType=machine_learning" in proc.stdout
