"""hydra/launcher=slurm for real: a reward-weight sweep submitted to a single-node Slurm cluster
started on this machine (tests/slurm_cluster.py), found in MLflow and compared.

The jobs run against the scripted server (opd/serving/scripted_server.py): what is under test is the
way there (sbatch, array tasks, submitit's job folders, the venv's python on the node, the sweep
state read from the sweep dir, the MLflow nesting), not inference. A job past its time limit and
a cancelled job stop as opd/sweep/slurm.py promises: run KILLED, parent FAILED, the signal named.
"""

from __future__ import annotations

import csv
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from conftest import ROOT
from slurm_cluster import SlurmCluster, SlurmRefused, start_cluster, unavailable


def test_a_slurm_array_task_is_tagged_with_the_id_squeue_and_its_log_folder_use() -> None:
    from opd.sweep.state import scheduler_tags

    task = {"SLURM_JOB_ID": "7", "SLURM_ARRAY_JOB_ID": "6", "SLURM_ARRAY_TASK_ID": "1", "SLURMD_NODENAME": "n3"}
    assert scheduler_tags(task) == {"slurm.job_id": "6_1", "slurm.node": "n3"}
    assert scheduler_tags({"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n3"}) == {"slurm.job_id": "7", "slurm.node": "n3"}
    assert scheduler_tags({"HOME": "/root"}) == {}


def test_in_a_slurm_job_its_time_limit_signal_leaves_as_stopped_by_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    from opd.sweep.slurm import StoppedBySlurm, stopped_by_slurm

    before = signal.getsignal(signal.SIGUSR2), signal.getsignal(signal.SIGTERM)
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    with pytest.raises(StoppedBySlurm, match="Slurm sent SIGUSR2: its time limit is near") as caught:
        with stopped_by_slurm():
            os.kill(os.getpid(), signal.SIGUSR2)
            time.sleep(5)  # the signal interrupts this
    assert isinstance(caught.value.__cause__, KeyboardInterrupt)
    assert (signal.getsignal(signal.SIGUSR2), signal.getsignal(signal.SIGTERM)) == before  # the job's own handlers come back
    # Outside a Slurm job (a local or joblib sweep, a single run) the handlers are left alone.
    monkeypatch.delenv("SUBMITIT_EXECUTOR")
    with stopped_by_slurm():
        assert (signal.getsignal(signal.SIGUSR2), signal.getsignal(signal.SIGTERM)) == before


def test_a_slurm_signal_in_the_event_loop_lets_the_code_it_lands_in_finish_and_stops_the_run_at_its_next_await(monkeypatch: pytest.MonkeyPatch) -> None:
    # Raised by the handler itself, the interrupt lands wherever the main thread is: here inside a
    # section that holds a lock and gives it back without a `try` (the next taker would wait forever).
    import asyncio
    import threading

    from opd.event_loop import run_loop
    from opd.sweep.slurm import StoppedBySlurm, stopped_by_slurm

    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    lock = threading.Lock()
    sections: list[int] = []

    sent = threading.Event()

    def send() -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        sent.set()

    async def run() -> None:
        for step in range(50):
            lock.acquire()
            if step == 1:
                threading.Thread(target=send).start()
                assert sent.wait(30)  # the signal comes in step 1's section, whatever the load
            sections.append(step)
            lock.release()
            await asyncio.sleep(0)

    with pytest.raises(StoppedBySlurm, match="Slurm sent SIGTERM: it was cancelled"):
        with stopped_by_slurm():
            run_loop(run())
    assert sections == [0, 1] and not lock.locked()


def test_without_accounting_job_states_come_from_scontrol_and_a_forgotten_job_has_ended(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # sacct and scontrol as a cluster without accounting answers them (the real ones run in the
    # slurm tier below); `answer` holds what scontrol says next.
    from opd.sweep.slurm_watch import GONE, JobStates

    answer = tmp_path / "answer"
    (tmp_path / "sacct").write_text("#!/bin/sh\necho 'Slurm accounting storage is disabled' >&2\nexit 1\n")
    (tmp_path / "scontrol").write_text(f"#!/bin/sh\ncat {answer}.out\ncat {answer}.err >&2\nexit $(cat {answer}.rc)\n")
    for tool in ("sacct", "scontrol"):
        (tmp_path / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")

    def scontrol(out: str, err: str = "", rc: int = 0) -> None:
        for suffix, text in ((".out", out), (".err", err), (".rc", str(rc))):
            answer.with_suffix(suffix).write_text(text)

    watcher = JobStates(delay_s=600)
    for job in ("7_0", "7_1", "7_2", "7_3", "7_4", "9"):
        watcher.register_job(job)
    scontrol("JobId=8 ArrayJobId=7 ArrayTaskId=0 JobState=RUNNING NodeList=n1\n"
             "JobId=10 ArrayJobId=7 ArrayTaskId=1 JobState=FAILED NodeList=n2\n"
             "JobId=7 ArrayJobId=7 ArrayTaskId=2-3%16 JobState=PENDING NodeList=(null)\n")
    watcher.update()
    assert not watcher.accounting
    states = {job: watcher.get_state(job, mode="cache") for job in ("7_0", "7_1", "7_2", "7_3", "7_4")}
    assert states == {"7_0": "RUNNING", "7_1": "FAILED", "7_2": "PENDING", "7_3": "PENDING", "7_4": GONE}
    assert [watcher.is_done(job, mode="cache") for job in ("7_0", "7_1", "7_2", "7_4")] == [False, True, False, True]
    # A failed call changes nothing; a job slurmctld no longer knows has ended.
    scontrol("", "slurm_load_jobs error: Socket timed out on send/recv operation", 1)
    watcher.update()
    assert watcher.get_state("7_0", mode="cache") == "RUNNING" and watcher.get_state("9", mode="cache") == "UNKNOWN"
    scontrol("", "slurm_load_jobs error: Invalid job id specified", 1)
    watcher.update()
    assert watcher.get_state("7_0", mode="cache") == GONE and watcher.get_state("9", mode="cache") == GONE


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    try:
        cluster = start_cluster()
    except SlurmRefused as err:
        pytest.skip(f"the kernel or container refused a Slurm daemon: {err}")
    try:
        yield cluster
    finally:
        cluster.stop()
    assert not cluster.leftovers(), f"still running after the cluster stopped: {cluster.leftovers()}"


@pytest.mark.slurm
def test_the_fixture_cluster_runs_a_job_in_its_partition(slurm: SlurmCluster, tmp_path: Path) -> None:
    out = tmp_path / "hello.out"
    job_id = slurm.command("sbatch", "--parsable", f"--partition={slurm.partition}", "--cpus-per-task=1", "--mem=100M", "--wait",
                           f"--output={out}", "--wrap", "srun hostname", timeout=120).strip()
    assert out.read_text().strip() == slurm.node
    job = slurm.job(job_id)
    assert (job["JobState"], job["Partition"], job["NodeList"]) == ("COMPLETED", slurm.partition, slurm.node)


class _Sweep:
    """`python -m experiments.launch -m hydra/launcher=slurm ...` submitted to `slurm`, the jobs
    served by the scripted server at `url`, MLflow and the sweep dir in tmp_path; its stderr in
    tmp_path/launcher.err."""

    def __init__(self, slurm: SlurmCluster, tmp_path: Path, fixture_model: str, url: str, args: list[str], timeout_min: int = 15,
                 sweep_dir: str = "sweep") -> None:
        self.slurm, self.tmp_path = slurm, tmp_path
        self.uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
        env = {**slurm.env, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
        env.pop("MLFLOW_RUN_ID", None)
        self.stderr = tmp_path / "launcher.err"
        with self.stderr.open("w") as err:
            self.proc = subprocess.Popen([
                sys.executable, "-m", "experiments.launch", "-m", "hydra/launcher=slurm",
                # The cluster's partition and sizes (the config's defaults are a real cluster's).
                f"hydra.launcher.partition={slurm.partition}", "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=1",
                f"hydra.launcher.timeout_min={timeout_min}", "runner.progress=false",
                "server=vllm", f"server.model={fixture_model}", f"server.base_urls=[{url}]",
                f"tracking.uri={self.uri}", f"tracking.artifact_root={tmp_path / 'mlruns'}", f"hydra.sweep.dir={tmp_path}/{sweep_dir}", *args,
            ], cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)

    def running(self) -> bool:
        return self.proc.poll() is None

    def finished(self, timeout_s: float) -> tuple[subprocess.CompletedProcess, str]:
        """(the exited launcher with its stderr, its store); a launcher still waiting after
        `timeout_s` is killed and the test fails with what the launcher, the jobs and Slurm said."""
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the launcher still waited after {timeout_s:.0f} s\n{self.stop()}")
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, "", self.stderr.read_text(errors="replace")), self.uri

    def stop(self) -> str:
        """Kill the launcher (its jobs stay for the cluster to end); what it, the jobs and Slurm said."""
        said = self._diagnosis()
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        return said

    def _diagnosis(self) -> str:
        def tail(text: str, chars: int = 3000) -> str:
            return text[-chars:].strip()

        parts = [f"--- launcher stderr:\n{tail(self.stderr.read_text(errors='replace'))}"]
        for args in (("squeue", "--states=all", f"--partition={self.slurm.partition}"), ("scontrol", "-o", "show", "job")):
            try:
                parts.append(f"--- {' '.join(args)}:\n{tail(self.slurm.command(*args))}")
            except (RuntimeError, subprocess.TimeoutExpired) as err:
                parts.append(f"--- {' '.join(args)}: {err}")
        for log in sorted(self.tmp_path.glob("*/.submitit/*/*_log.*")) + sorted(self.tmp_path.glob("*/*/.submitit/*/*_log.*")):
            parts.append(f"--- {log.relative_to(self.tmp_path)}:\n{tail(log.read_text(errors='replace'))}")
        for daemon in ("slurmctld", "slurmd"):
            parts.append(f"--- {daemon}.log:\n{tail(self.slurm.log(daemon))}")
        return "\n".join(parts)


def _slurm_sweep(slurm: SlurmCluster, tmp_path: Path, fixture_model: str, url: str, args: list[str],
                 sweep_dir: str = "sweep") -> tuple[subprocess.CompletedProcess, str]:
    """A `_Sweep` run to its end: (the exited launcher, its store)."""
    return _Sweep(slurm, tmp_path, fixture_model, url, args, sweep_dir=sweep_dir).finished(420)


def _mlflow_runs(uri: str):
    import mlflow

    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], max_results=100)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = sorted((r for r in runs if "mlflow.parentRunId" in r.data.tags), key=lambda r: r.info.run_name)
    return client, parents, children


@pytest.mark.slurm
def test_a_reward_weight_sweep_runs_as_slurm_jobs_and_nests_in_mlflow(slurm: SlurmCluster, tmp_path: Path, fixture_model: str) -> None:
    from experiments.bench import scripted_server
    from opd.records import read_groups
    from opd.sweep.state import read_state

    with scripted_server(0.01) as url:
        proc, uri = _slurm_sweep(slurm, tmp_path, fixture_model, url, [
            "env=inline_math", "reward.weights.correct=0.5,1.0", "total_steps=2", "group_size=2",
        ], sweep_dir="sweeps/${now:%H-%M-%S}")  # timestamped like the default: each job must find the launcher's
    assert proc.returncode == 0, proc.stderr[-4000:]
    (sweep_dir,) = (tmp_path / "sweeps").iterdir()

    client, parents, children = _mlflow_runs(uri)
    (parent,) = parents
    assert parent.info.status == "FINISHED"
    assert read_state(sweep_dir).parent_run_id == parent.info.run_id
    assert (parent.data.tags["opd.swept"], parent.data.tags["opd.jobs"]) == ("reward.weights.correct", "2")
    assert [c.info.run_name for c in children] == ["correct=0.5", "correct=1.0"]
    array_ids = set()
    for num, child in enumerate(children):
        assert child.info.status == "FINISHED"
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert child.data.params["reward.weights.correct"] == ["0.5", "1.0"][num]
        assert len(client.get_metric_history(child.info.run_id, "reward/mean")) == 2
        assert "objective" in child.data.metrics
        # Each job ran as a task of one Slurm array in the named partition, on the node, in a
        # process of its own, and wrote its groups to its folder of the launcher's sweep dir.
        job_id = child.data.tags["slurm.job_id"]
        array_id, task = job_id.split("_")
        array_ids.add(array_id)
        job = slurm.ended(job_id)
        assert (job["JobState"], job["Partition"], job["NodeList"]) == ("COMPLETED", slurm.partition, slurm.node)
        assert child.data.tags["slurm.node"] == slurm.node
        assert child.data.tags["opd.pid"] != parent.data.tags["opd.launcher_pid"]
        out = Path(child.data.tags["output_dir"])
        assert out.parent == sweep_dir.resolve() and out.name == task
        assert len(list(read_groups(out / "groups.jsonl"))) == 2
        # submitit's job folder holds the job's log and result.
        folder = sweep_dir / ".submitit" / job_id
        assert (folder / f"{job_id}_0_result.pkl").exists()
        logs = "".join((folder / f"{job_id}_0_log.{kind}").read_text() for kind in ("out", "err"))
        assert f"MLflow run {child.info.run_id} ended FINISHED" in logs and "Job completed successfully" in logs
    (array_id,) = array_ids
    # The batch script runs the launcher's interpreter (the project's venv) on the node.
    script = (sweep_dir / ".submitit" / array_id / f"{array_id}_submission.sh").read_text()
    assert f"#SBATCH --partition={slurm.partition}" in script
    assert f"{shlex.quote(sys.executable)} -u -m submitit.core._submit" in script

    compare = subprocess.run([sys.executable, "-m", "experiments.compare", str(sweep_dir)], cwd=ROOT, env=slurm.env, capture_output=True, text=True, timeout=300)
    assert compare.returncode == 0, compare.stderr[-2000:]
    with (sweep_dir / "compare.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert sorted(r["run"] for r in rows) == ["correct=0.5", "correct=1.0"] and {r["status"] for r in rows} == {"FINISHED"}
    logged = {a.path for a in client.list_artifacts(parent.info.run_id, "compare")}
    assert logged == {"compare/compare.csv", "compare/compare.png"}


def _wait_for_a_group(groups: Path, sweep: _Sweep) -> None:
    """Until the sweep's job has written a group to `groups` (the launcher still running)."""
    deadline = time.monotonic() + 240
    while not (groups.exists() and groups.stat().st_size > 0):
        assert sweep.running(), f"the launcher exited before its job wrote a group:\n{sweep.stderr.read_text()[-3000:]}"
        if time.monotonic() > deadline:
            pytest.fail(f"the job wrote no group in 240 s\n{sweep.stop()}")
        time.sleep(0.5)


def _seconds(elapsed: str) -> int:
    """Slurm's [D-]HH:MM:SS (RunTime) in seconds."""
    days, _, clock = elapsed.rpartition("-")
    hours, minutes, seconds = (int(part) for part in clock.split(":"))
    return int(days or 0) * 86400 + hours * 3600 + minutes * 60 + seconds


@pytest.mark.slurm
def test_a_job_past_its_time_limit_stops_killed_with_its_groups_kept(slurm: SlurmCluster, tmp_path: Path, fixture_model: str) -> None:
    # Slurm sends USR2 signal_delay_s before the limit (up to a minute early). 3 s per request and
    # two groups in flight keep the job busy until then. The job is submitted with timeout_min=3;
    # once it has written a group its limit is lowered to 1-2 minutes past its run time, so that
    # the signal comes within a minute of that (not near the third minute) and after a group.
    from experiments.bench import scripted_server
    from opd.records import read_groups

    with scripted_server(3.0) as url:
        sweep = _Sweep(slurm, tmp_path, fixture_model, url, [
            "env=inline_math", "seed=0", "total_steps=500", "group_size=1", "runner.groups_in_flight=2", "hydra.launcher.signal_delay_s=60",
        ], timeout_min=3)
        _wait_for_a_group(tmp_path / "sweep" / "0" / "groups.jsonl", sweep)
        (job_id,) = slurm.command("squeue", "--noheader", "--states=RUNNING", "--format=%i", f"--partition={slurm.partition}").split()
        job = slurm.job(job_id)
        assert job["TimeLimit"] == "00:03:00"  # hydra.launcher.timeout_min
        slurm.command("scontrol", "update", f"JobId={job_id}", f"TimeLimit={_seconds(job['RunTime']) // 60 + 2}")
        proc, uri = sweep.finished(300)
    assert proc.returncode != 0
    assert "StoppedBySlurm: Slurm sent SIGUSR2: its time limit is near" in proc.stderr
    _, parents, children = _mlflow_runs(uri)
    assert [p.info.status for p in parents] == ["FAILED"]
    (child,) = children
    assert child.info.status == "KILLED"
    # The job ended itself, before the limit (a job the limit ends says TIMEOUT).
    assert slurm.ended(child.data.tags["slurm.job_id"])["JobState"] == "COMPLETED"
    assert 0 < len(list(read_groups(tmp_path / "sweep" / "0" / "groups.jsonl"))) < 500


@pytest.mark.slurm
def test_a_cancelled_job_stops_killed_and_the_launcher_says_so(slurm: SlurmCluster, tmp_path: Path, fixture_model: str) -> None:
    from experiments.bench import scripted_server

    with scripted_server(3.0) as url:
        sweep = _Sweep(slurm, tmp_path, fixture_model, url, [
            "env=inline_math", "seed=0", "total_steps=500", "group_size=1", "runner.groups_in_flight=2",
        ])
        # Cancel once the job has written a group.
        _wait_for_a_group(tmp_path / "sweep" / "0" / "groups.jsonl", sweep)
        slurm.command("scancel", "--partition", slurm.partition)
        proc, uri = sweep.finished(300)
    assert proc.returncode != 0
    assert "StoppedBySlurm: Slurm sent SIGTERM: it was cancelled" in proc.stderr
    _, parents, children = _mlflow_runs(uri)
    assert [p.info.status for p in parents] == ["FAILED"]
    assert [c.info.status for c in children] == ["KILLED"]


@pytest.mark.slurm
def test_a_job_killed_without_a_result_fails_the_sweep_on_a_cluster_without_accounting(slurm: SlurmCluster, tmp_path: Path, fixture_model: str) -> None:
    # The test cluster keeps no accounting, so `sacct` cannot say the job ended: submitit alone
    # would wait for its result forever (opd/sweep/slurm_watch.py).
    import psutil

    from experiments.bench import scripted_server

    with scripted_server(3.0) as url:
        sweep = _Sweep(slurm, tmp_path, fixture_model, url, ["env=inline_math", "seed=0", "total_steps=500", "group_size=1"])
        _wait_for_a_group(tmp_path / "sweep" / "0" / "groups.jsonl", sweep)
        # As the OOM killer would: the job's process dies at once, with no result written.
        (job,) = [p for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or [""])[0] == sys.executable
                  and "submitit.core._submit" in p.info["cmdline"] and str(tmp_path) in " ".join(p.info["cmdline"])]
        job.kill()
        proc, uri = sweep.finished(300)
    assert proc.returncode != 0
    assert "has not produced any output (state: FAILED)" in proc.stderr and f"srun: error: {slurm.node}: task 0: Killed" in proc.stderr
    assert "Bypassing sacct error" not in proc.stderr  # no warning at every poll
    _, parents, children = _mlflow_runs(uri)
    assert [p.info.status for p in parents] == ["FAILED"]
    assert [c.info.status for c in children] == ["FAILED"]  # left RUNNING by the job, closed by the launcher

