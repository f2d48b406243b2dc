"""hydra/launcher=slurm for real: a reward-weight sweep submitted to a single-node Slurm cluster
started on this machine (tests/slurm_cluster.py), found in MLflow and compared.

The jobs run against the scripted server (opd/bench/scripted_server.py): what is under test is the
way there (sbatch, array tasks, submitit's job folders, the venv's python on the node, the sweep
state read from the sweep dir, the MLflow nesting), not inference.
"""

from __future__ import annotations

import csv
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from conftest import ROOT
from slurm_cluster import SlurmCluster, SlurmRefused, start_cluster, unavailable

pytestmark = pytest.mark.slow


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


def test_the_fixture_cluster_runs_a_job_in_its_partition(slurm: SlurmCluster, tmp_path: Path) -> None:
    out = tmp_path / "hello.out"
    job_id = slurm.command("sbatch", "--parsable", f"--partition={slurm.partition}", "--cpus-per-task=1", "--mem=100M", "--wait",
                           f"--output={out}", "--wrap", "srun hostname", timeout=120).strip()
    assert out.read_text().strip() == slurm.node
    job = slurm.job(job_id)
    assert (job["JobState"], job["Partition"], job["NodeList"]) == ("COMPLETED", slurm.partition, slurm.node)


def _mlflow_runs(uri: str):
    import mlflow

    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], max_results=100)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = sorted((r for r in runs if "mlflow.parentRunId" in r.data.tags), key=lambda r: r.info.run_name)
    return client, parents, children


def test_a_reward_weight_sweep_runs_as_slurm_jobs_and_nests_in_mlflow(slurm: SlurmCluster, tmp_path: Path, fixture_model: str) -> None:
    from experiments.bench import scripted_server
    from opd.records import read_groups
    from opd.sweep.state import read_state

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**slurm.env, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    env.pop("MLFLOW_RUN_ID", None)
    with scripted_server(0.01) as url:
        proc = subprocess.run([
            sys.executable, "-m", "experiments.launch", "-m", "hydra/launcher=slurm",
            # The cluster's partition and sizes (the config's defaults are a GPU cluster's).
            f"hydra.launcher.partition={slurm.partition}", "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=1",
            "hydra.launcher.timeout_min=15",
            "env=inline_math", "reward.weights.correct=0.5,1.0", "total_steps=2", "group_size=2", "runner.progress=false",
            "server=vllm", f"server.model={fixture_model}", f"server.base_urls=[{url}]",
            f"tracking.uri={uri}", f"tracking.artifact_root={tmp_path / 'mlruns'}",
            # A timestamped sweep dir like the default: each job must find the launcher's.
            f"hydra.sweep.dir={tmp_path}/sweeps/${{now:%H-%M-%S}}",
        ], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
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
        job = slurm.job(job_id)
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

    compare = subprocess.run([sys.executable, "-m", "experiments.compare", str(sweep_dir)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert compare.returncode == 0, compare.stderr[-2000:]
    with (sweep_dir / "compare.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert sorted(r["run"] for r in rows) == ["correct=0.5", "correct=1.0"] and {r["status"] for r in rows} == {"FINISHED"}
    logged = {a.path for a in client.list_artifacts(parent.info.run_id, "compare")}
    assert logged == {"compare/compare.csv", "compare/compare.png"}
