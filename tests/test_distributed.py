"""Environment workers on a real Ray cluster (runner.workers=2), against the scripted server.

Most tests join one small cluster started for this module (through RAY_ADDRESS, as a user joins
theirs); the driver-kill test lets the run start its own local cluster, as a plain launch does.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest
from procs import cmdline, descendants

from conftest import ROOT, compose
from helpers import assert_taught, launch, launch_process, lines, mlflow_run, run_args
from opd.config import ConfigError, validate
from opd.distributed.worker import slot_share
from opd.records import check_group, read_groups
from opd.serving.weights import ServedWeights

FIXTURE = ROOT / "opd" / "fixture" / "model"


def test_every_worker_gets_a_share_of_the_request_slots() -> None:
    assert [slot_share(8, 3, i) for i in range(3)] == [3, 3, 2]
    assert sum(slot_share(33, 4, i) for i in range(4)) == 33
    with pytest.raises(ValueError, match="workers <= slots"):
        slot_share(2, 3, 0)


def test_more_workers_than_request_slots_is_refused_naming_the_keys() -> None:
    with pytest.raises(ConfigError, match=r"runner.workers must be <= server.max_requests_in_flight \(4"):
        validate(compose(["runner.workers=5", "server.max_requests_in_flight=4"]))
    with pytest.raises(ConfigError, match="runner.ray.object_store_mb must be >= 75"):
        validate(compose(["runner.ray.object_store_mb=10"]))


# ---------------------------------------------------------------- the real cluster

CLUSTER = """
import signal, sys, time, ray
ray.init(address="local", num_cpus=2, num_gpus=0, include_dashboard=False, object_store_memory=128 * 2**20, _temp_dir=sys.argv[1])
print(ray.get_runtime_context().gcs_address, flush=True)
signal.signal(signal.SIGTERM, lambda *_: (ray.shutdown(), sys.exit(0)))
while True:
    time.sleep(1)
"""


@pytest.fixture(scope="module")
def ray_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A 2-CPU local Ray cluster in its own process (stopped with it); yields its address."""
    import tempfile

    temp_dir = tempfile.mkdtemp(prefix="opd-ray-test-")  # short: Ray's unix sockets live there
    proc = subprocess.Popen([sys.executable, "-c", CLUSTER, temp_dir], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        address = proc.stdout.readline().strip()
        assert address and proc.poll() is None, "the test's Ray cluster did not start"
        yield address
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        subprocess.run(["rm", "-rf", temp_dir], check=False)


@pytest.fixture(scope="module")
def scripted_url() -> Iterator[str]:
    from experiments.bench.common import scripted_server

    with scripted_server(0.05) as url:
        yield url


def _args(steps: int, extra: list[str] = ()) -> list[str]:
    """Two workers on the cluster, `steps` groups of 2 (after `helpers.run_args`)."""
    return ["env=inline_math", "server.max_requests_in_flight=8", "group_size=2", f"total_steps={steps}", "runner.workers=2",
            "runner.ray.cpus_per_worker=0.5", *extra]


def _join(monkeypatch: pytest.MonkeyPatch, address: str) -> None:
    """Join the module's cluster as a user joins theirs: its address, and its token (Ray keeps a
    local cluster's in ~/.ray/auth_token; a client uses it only with RAY_AUTH_MODE=token)."""
    monkeypatch.setenv("RAY_ADDRESS", address)
    monkeypatch.setenv("RAY_AUTH_MODE", "token")


def _launch(tmp_path: Path, url: str, steps: int, extra: list[str] = ()) -> float:
    return launch(tmp_path, FIXTURE, url, _args(steps, extra))


def _assert_one_valid_file(path: Path, steps: int) -> list[dict]:
    """Exactly `steps` groups, each valid, no item twice, and the checker agrees."""
    groups = list(read_groups(path))
    assert len(groups) == steps
    assert all(not check_group(g) for g in groups)
    items = [g["group_overrides"]["item_id"] for g in groups]
    assert len(set(items)) == steps, f"an item was written twice: {items}"
    check = subprocess.run([sys.executable, "-m", "opd.records", "check", str(path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert check.returncode == 0 and f"{steps} groups, 0 problems" in check.stdout + check.stderr, check.stdout + check.stderr
    return groups


def _env_workers(root: int) -> list[int]:
    return [pid for pid in descendants(root) if cmdline(pid).startswith("ray::EnvWorker")]


def test_every_group_waiting_for_a_worker_wakes_when_one_comes_back() -> None:
    """Groups wait while every worker restarts; one worker given up wakes them (they wait again),
    then the other coming back must reach each of them (a waiter once dropped another's event
    and waited forever). Ray is not imported here: imported before `_join` sets RAY_AUTH_MODE,
    this process's later clients would send no token to the module's cluster."""

    from opd.distributed.source import Worker, WorkerSource

    async def scenario() -> list[int]:
        workers = [Worker(0, None, 1, up=False), Worker(1, None, 1, up=False)]
        source = WorkerSource(None, workers)  # type: ignore[arg-type]
        waiting = [asyncio.create_task(source._pick(None)) for _ in range(3)]
        await asyncio.sleep(0.01)
        workers[0].gone = True
        source._wake()
        await asyncio.sleep(0.01)
        assert not any(t.done() for t in waiting)
        workers[1].up = True
        source._wake()
        done, pending = await asyncio.wait(waiting, timeout=5)
        assert not pending
        return [t.result().index for t in waiting]

    assert asyncio.run(scenario()) == [1, 1, 1]


def test_two_workers_write_one_valid_file_and_one_mlflow_run(tmp_path: Path, scripted_url: str, ray_address: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _join(monkeypatch, ray_address)
    _launch(tmp_path, scripted_url, 16)
    _assert_one_valid_file(tmp_path / "run" / "groups.jsonl", 16)
    client, run = mlflow_run(tmp_path)
    metrics = run.data.metrics
    assert run.info.status == "FINISHED"
    assert metrics["summary/groups_written"] == 16 and metrics["summary/workers"] == 2
    # Both workers generated; the driver wrote every group, at steps 1..16.
    assert metrics["summary/worker_0_groups"] > 0 and metrics["summary/worker_1_groups"] > 0
    assert metrics["summary/worker_0_groups"] + metrics["summary/worker_1_groups"] == 16
    assert metrics["summary/worker_groups_lost"] == 0
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "reward/mean")) == list(range(1, 17))


@pytest.mark.ray
def test_a_killed_worker_loses_only_its_groups_in_flight(tmp_path: Path, scripted_url: str, ray_address: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _join(monkeypatch, ray_address)
    groups_path = tmp_path / "run" / "groups.jsonl"
    killed: list[int] = []

    def kill_one() -> None:
        deadline = time.monotonic() + 300
        while lines(groups_path) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        workers = [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc"))) if cmdline(pid).startswith("ray::EnvWorker") and _in_test_cluster(pid)]
        if workers:
            os.kill(workers[0], signal.SIGKILL)
            killed.append(workers[0])

    thread = threading.Thread(target=kill_one, daemon=True)
    thread.start()
    _launch(tmp_path, scripted_url, 40, ["runner.ray.max_restarts=0"])
    thread.join()
    assert killed, "no worker to kill was found"
    _assert_one_valid_file(groups_path, 40)
    _, run = mlflow_run(tmp_path)
    metrics = run.data.metrics
    assert run.info.status == "FINISHED"
    assert metrics["summary/workers_lost"] == 1
    # Its groups in flight were lost, counted and redone on the other worker; none was given up.
    assert metrics["summary/worker_groups_lost"] >= 1
    assert metrics["summary/groups_failed"] == 0 and metrics["summary/items_given_up"] == 0
    assert metrics["runner/worker_groups_lost"] == metrics["summary/worker_groups_lost"]  # the per-group history has it too


def _in_test_cluster(pid: int) -> bool:
    """Is `pid` a worker of the module's cluster (not of someone else's Ray on this machine)?"""
    try:
        ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return False
    return "raylet" in cmdline(ppid) and "opd-ray-test-" in cmdline(ppid)


def _subprocess_launch(tmp_path: Path, url: str, steps: int, extra: list[str]) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)  # a local cluster of the run's own
    return launch_process(tmp_path, FIXTURE, url, _args(steps, extra), env=env)


@pytest.mark.ray
def test_resume_after_the_driver_is_killed_takes_its_ray_cluster_down(tmp_path: Path, scripted_url: str) -> None:
    import glob
    import shutil

    drivers: list[int] = []
    try:
        _kill_driver_and_resume(tmp_path, scripted_url, drivers)
    finally:  # the killed driver could not remove its cluster's folder (Ray names the session by its pid)
        for session in (s for pid in drivers for s in glob.glob(f"/tmp/opd-ray-*/session_*_{pid}")):
            shutil.rmtree(Path(session).parent, ignore_errors=True)


def _kill_driver_and_resume(tmp_path: Path, scripted_url: str, drivers: list[int]) -> None:
    groups_path = tmp_path / "run" / "groups.jsonl"
    # Slow groups (many tool-free rollouts at 50 ms, 4 slots) so the kill lands mid-run.
    proc = _subprocess_launch(tmp_path, scripted_url, 24, ["server.max_requests_in_flight=4", "runner.ray.max_restarts=0"])
    drivers.append(proc.pid)
    deadline = time.monotonic() + 600
    while lines(groups_path) < 3:
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "stderr.log").read_text()[-3000:]
        time.sleep(0.02)
    workers = _env_workers(proc.pid)
    assert len(workers) == 2
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # The workers (and the local cluster) die with the driver.
    deadline = time.monotonic() + 60
    while any(cmdline(pid).startswith("ray::EnvWorker") for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not any(cmdline(pid).startswith("ray::EnvWorker") for pid in workers), "environment workers outlived their driver"
    data = groups_path.read_bytes()
    complete = data[: data.rfind(b"\n") + 1].decode().splitlines()
    assert 3 <= len(complete) < 24
    client, run = mlflow_run(tmp_path)
    run_id = run.info.run_id

    proc = _subprocess_launch(tmp_path, scripted_url, 24, ["server.max_requests_in_flight=4", "resume=true"])
    assert proc.wait(timeout=900) == 0, (tmp_path / "stderr.log").read_text()[-3000:]
    groups = _assert_one_valid_file(groups_path, 24)
    assert [json.loads(line) for line in complete] == groups[: len(complete)]  # kept as they were
    client, run = mlflow_run(tmp_path)
    assert run.info.run_id == run_id and run.info.status == "FINISHED"
    assert run.data.metrics["summary/groups_written"] == 24 and run.data.metrics["summary/workers"] == 2


@pytest.mark.slow
def test_one_worker_runs_without_ray(tmp_path: Path, scripted_url: str) -> None:
    overrides = [*run_args(tmp_path, FIXTURE, scripted_url), *_args(4, ["runner.workers=1"]), f"output_dir={tmp_path / 'run'}"]
    code = (
        "import sys\n"
        "sys.path.insert(0, 'tests')\n"
        "from conftest import compose\n"
        "from experiments.launch import launch\n"
        f"launch(compose({overrides!r}))\n"
        "assert 'ray' not in sys.modules, 'runner.workers=1 imported ray'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    _assert_one_valid_file(tmp_path / "run" / "groups.jsonl", 4)


@pytest.mark.ray
def test_a_sweep_with_workers_nests_two_finished_children(tmp_path: Path, scripted_url: str, ray_address: str) -> None:
    import mlflow

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "RAY_ADDRESS": ray_address, "RAY_AUTH_MODE": "token"}
    env.pop("MLFLOW_RUN_ID", None)
    cmd = [sys.executable, "-m", "experiments.launch", "-m", *run_args(tmp_path, FIXTURE, scripted_url), *_args(6), "reward.weights.correct=1.0,0.5",
           f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED" and len(children) == 2
    for child in children:
        assert child.info.status == "FINISHED" and child.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert child.data.metrics["summary/workers"] == 2 and child.data.metrics["summary/groups_written"] == 6
    for job in ("0", "1"):
        _assert_one_valid_file(tmp_path / "sweep" / job / "groups.jsonl", 6)


def _stub_source(ray, restarts: int, delay_s: float):
    """Two stub workers behind a WorkerSource (the class is local, so Ray ships it by value)."""
    from types import SimpleNamespace

    class StubWorker:
        """An actor with EnvWorker's calls and no environment: a group is a dict after `delay_s`."""

        def __init__(self, delay_s: float) -> None:
            self.delay_s = delay_s

        async def ping(self) -> int:
            return os.getpid()

        async def collect(self, item: dict, weight_version: int) -> dict:
            import asyncio

            await asyncio.sleep(self.delay_s)
            return {"group_overrides": {"item_id": item["id"], "weight_version": weight_version, "pid": os.getpid()}}

    from opd.distributed.source import Worker, WorkerSource

    actors = [ray.remote(StubWorker).options(num_cpus=0, max_restarts=restarts).remote(delay_s) for _ in range(2)]
    ray.get([a.ping.remote() for a in actors])
    return WorkerSource(SimpleNamespace(served_weights=ServedWeights(3)), [Worker(i, a, 4) for i, a in enumerate(actors)]), actors


@pytest.mark.ray
def test_a_restarted_worker_takes_groups_again_and_none_left_ends_the_run(ray_address: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    _join(monkeypatch, ray_address)  # before Ray reads its settings at import
    import ray

    from opd.distributed.source import WorkersLost

    ray.init(address=ray_address, configure_logging=False, log_to_driver=False)
    try:
        source, actors = _stub_source(ray, restarts=1, delay_s=0.5)

        async def run() -> list[dict]:
            groups = asyncio.gather(*(source.collect_trajectories({"id": i}) for i in range(8)))
            await asyncio.sleep(0.2)
            ray.kill(actors[0], no_restart=False)  # dies with its groups in flight; Ray restarts it
            done = [g for g, _ in await groups]
            for _ in range(600):  # the probe sees it back
                if source.restarts:
                    break
                await asyncio.sleep(0.1)
            done += [g for g, _ in await asyncio.gather(*(source.collect_trajectories({"id": i}) for i in range(8, 16)))]
            return done

        groups = asyncio.run(run())
        assert sorted(g["group_overrides"]["item_id"] for g in groups) == list(range(16))  # every group, once
        assert all(g["group_overrides"]["weight_version"] == 3 for g in groups)  # the driver's version travels
        assert source.groups_lost >= 1 and source.restarts == 1
        assert source.workers[0].groups > 0 and source.workers[0].up  # back in service after its restart

        source, actors = _stub_source(ray, restarts=0, delay_s=0.5)

        async def all_die() -> None:
            groups = asyncio.gather(*(source.collect_trajectories({"id": i}) for i in range(4)))
            await asyncio.sleep(0.2)
            for actor in actors:
                ray.kill(actor)
            await groups

        with pytest.raises(WorkersLost, match="all 2 environment workers died"):
            asyncio.run(all_die())
    finally:
        ray.shutdown()


@pytest.mark.ray
def test_a_local_trainer_in_the_driver_sees_every_group_and_workers_record_its_versions(tmp_path: Path, scripted_url: str, ray_address: str,
                                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _join(monkeypatch, ray_address)
    # No weight refresh: the scripted server has no weights; the trainer steps all the same, on
    # groups it kept though the scripted answers score them all alike.
    _launch(tmp_path, scripted_url, 12, ["trainer=local", "trainer.refresh=false", "trainer.batch_groups=2", "trainer.max_staleness=100",
                                         "trainer.equal_score_groups=keep"])
    groups = _assert_one_valid_file(tmp_path / "run" / "groups.jsonl", 12)
    _, run = mlflow_run(tmp_path)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["summary/trainer_steps"] == 6 and run.data.metrics["summary/weight_version"] == 6
    versions = [g["group_overrides"]["weight_version"] for g in groups]
    # Groups generated in the workers after a step carry the driver's newer version.
    assert versions[0] == 0 and max(versions) >= 1


@pytest.mark.ray
def test_workers_score_every_sampled_token_with_the_teacher_model_within_its_slots(tmp_path: Path, scripted_url: str, ray_address: str,
                                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from experiments.bench.common import scripted_server

    _join(monkeypatch, ray_address)
    # A second scripted server (it answers prompt-logprob scoring too) is the teacher's running
    # server; slow enough that scoring requests overlap, so more than 2 at once would show.
    with scripted_server(0.3) as teacher_url:
        _launch(tmp_path, scripted_url, 8, ["teacher=model", "teacher.server.model=fixture", f"teacher.server.base_url={teacher_url}",
                                            "teacher.max_concurrent=2", "distill_topk=4"])
        with urllib.request.urlopen(teacher_url.removesuffix("/v1") + "/stats", timeout=10) as response:
            most_in_flight = json.load(response)["most_in_flight"]
    # The two workers together held at most teacher.max_concurrent scoring requests (one each).
    assert 1 <= most_in_flight <= 2
    groups = _assert_one_valid_file(tmp_path / "run" / "groups.jsonl", 8)
    for group in groups:
        assert_taught(group, topk=4)
    _, run = mlflow_run(tmp_path)
    metrics = run.data.metrics
    assert run.info.status == "FINISHED" and metrics["teacher/token_coverage"] == 1.0
    assert metrics["summary/worker_0_groups"] > 0 and metrics["summary/worker_1_groups"] > 0


def test_more_workers_than_teacher_slots_is_refused_naming_the_keys() -> None:
    with pytest.raises(ConfigError, match=r"runner.workers must be <= teacher.max_concurrent \(2; each worker needs a teacher slot"):
        validate(compose(["runner.workers=3", "teacher=model", "teacher.server.model=fixture", "teacher.max_concurrent=2"]))


@pytest.mark.ray
def test_the_overhead_bench_runs_on_workers_and_counts_their_cpu(ray_address: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from experiments.bench import bench_overhead

    _join(monkeypatch, ray_address)
    (result,) = bench_overhead(1, latencies=(0.05,), limits=(4,), workers=(2,), overrides=("runner.ray.cpus_per_worker=0.5",))
    assert result["workers"] == 2 and result["rollouts"] == 40
    assert 0.1 < result["fraction_of_ideal"] <= 1.05 and 0.1 < result["bare_client_fraction_of_ideal"] <= 1.05
    # The workers generated (their CPU), the driver only checked and wrote (its own).
    assert result["workers_cpu_ms_per_rollout"] > 0 and result["env_cpu_ms_per_rollout"] > 0
    # The breakdown has the workers' phases too (the request took the server's 50 ms there).
    spent = result["latency_ms"]
    assert spent["request"] >= 45 and {"slot", "transfer", "check", "sinks"} <= set(spent) and spent["total"] >= spent["request"]
