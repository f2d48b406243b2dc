"""experiment=opd_vs_grpo end to end at a tiny budget, on real vLLM: the session's fixture server as
the student and the fixture's teacher on the sweep's one shared teacher server. The three arms run
as closed loops on teacher rows, the teacher is evaluated once for the whole sweep (the ceiling of
gap closed), and experiments.compare ranks the arms by paired gain and gap closed. Without a
teacher, `arm=opd` is refused before it starts (tests/test_config.py)."""

from __future__ import annotations

import asyncio
import csv
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from test_sweep import _runs, _sweep

pytest.importorskip("torch")

TINY = ["sweep.seeds=1", "total_steps=2", "group_size=2", "trainer.batch_groups=1", "eval.every=2", "eval.max_items=4",
        "eval.samples_per_item=2", "runner.groups_in_flight=1", "trainer.equal_score_groups=keep"]


@pytest.fixture
def restores_the_fixture_weights(vllm_url: str, untied_fixture: str):
    yield
    from opd.train.refresh import refresh

    asyncio.run(refresh([vllm_url], Path(untied_fixture)))


@pytest.mark.vllm
@pytest.mark.slow
def test_the_experiment_runs_its_three_arms_on_teacher_rows_and_compare_ranks_them(
        tmp_path: Path, fixture_model: str, vllm_url: str, restores_the_fixture_weights) -> None:
    proc, sweep_dir, uri = _sweep(tmp_path, fixture_model, vllm_url, ["experiment=opd_vs_grpo", *TINY])
    assert proc.returncode == 0, proc.stderr[-3000:]
    # One teacher server for the sweep (the jobs started none), one teacher evaluation for all jobs.
    assert (sweep_dir / "vllm_teacher" / "server.log").is_file() and not list(sweep_dir.glob("*/vllm_teacher"))
    assert len(list(sweep_dir.glob("teacher_eval_*.json"))) == 1
    assert sum("the teacher's evaluation is the one" in (job / "launch.log").read_text() for job in sweep_dir.glob("[0-9]*")) == 2
    client, (parent,), children = _runs(uri)
    assert parent.info.status == "FINISHED" and parent.data.tags["opd.swept"] == "arm"
    runs = {c.data.params["arm"]: c for c in children}
    assert set(runs) == {"grpo", "opd", "opd_topk"} and all(c.info.status == "FINISHED" for c in children)
    expected = {"grpo": {"pg": 1.0, "opd_advantage": 0.0, "topk_kl": 0.0}, "opd": {"pg": 0.0, "opd_advantage": 1.0, "topk_kl": 0.0},
                "opd_topk": {"pg": 0.0, "opd_advantage": 0.0, "topk_kl": 1.0}}
    for arm, run in runs.items():
        assert run.info.run_name == f"arm={arm}"
        assert {name: float(run.data.params[f"trainer.loss.{name}"]) for name in expected[arm]} == expected[arm]
        assert run.data.params["dataset.kinds"] == "None" and run.data.params["teacher.kind"] == "model"  # all nine kinds, one teacher
        assert [m.step for m in client.get_metric_history(run.info.run_id, "trainer/loss")] == [1, 2]
        assert [m.step for m in client.get_metric_history(run.info.run_id, "eval/sampled_accuracy")] == [0, 2]
        assert run.data.tags["opd.objective"] == "summary/gap_closed"
        metrics = run.data.metrics
        gap = metrics["summary/teacher_sampled_accuracy"] - metrics["summary/first_sampled_accuracy"]
        assert gap > 0 and metrics["objective"] == pytest.approx(metrics["summary/eval_paired_gain"] / gap)
        assert [m.step for m in client.get_metric_history(run.info.run_id, "eval/gap_closed")] == [0, 2]
        assert [m.value for m in client.get_metric_history(run.info.run_id, "eval/weight_version")] == [0.0, 2.0]
    # Every arm's groups carry the teacher's rows on every sampled token, with the reverse KL to the
    # teacher on those fresh samples, and the OPD arm's trainer computes its term from them at each step.
    for arm, run in runs.items():
        coverage = [m.value for m in client.get_metric_history(run.info.run_id, "teacher/token_coverage")]
        assert len(coverage) == 2 and set(coverage) == {1.0}, (arm, coverage)
        assert all(m.value > 0 for m in client.get_metric_history(run.info.run_id, "teacher/reverse_kl"))  # the fixture is not its teacher
        teacher_eval = client.get_metric_history(run.info.run_id, "teacher_eval/sampled_accuracy")
        assert [m.step for m in teacher_eval] == [0] and teacher_eval[0].value == runs["grpo"].data.metrics["summary/teacher_sampled_accuracy"]
    assert [m.step for m in client.get_metric_history(runs["opd"].info.run_id, "trainer/loss_opd_advantage")] == [1, 2]
    assert [m.step for m in client.get_metric_history(runs["opd"].info.run_id, "trainer/reverse_kl_to_teacher")] == [1, 2]
    assert [m.step for m in client.get_metric_history(runs["opd_topk"].info.run_id, "trainer/loss_topk_kl")] == [1, 2]
    # Every arm starts from the same checkpoint and seeded samples: their first evaluations agree.
    firsts = {arm: client.get_metric_history(run.info.run_id, "eval/sampled_accuracy")[0].value for arm, run in runs.items()}
    assert len(set(firsts.values())) == 1, firsts
    compared = subprocess.run([sys.executable, "-m", "experiments.compare", str(sweep_dir)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert compared.returncode == 0, compared.stderr[-2000:]
    assert "ranked by paired held-out gain" in compared.stdout and "best: arm=" in compared.stdout
    assert "gap to the teacher closed" in compared.stdout and (sweep_dir / "compare_gap.png").read_bytes()[:4] == b"\x89PNG"
    with (sweep_dir / "compare_gain.csv").open() as handle:
        ranking = list(csv.DictReader(handle))
    assert {r["arm"] for r in ranking} == {"grpo", "opd", "opd_topk"} and all(r["seeds"] == "1" and r["items"] == "4" for r in ranking)
    for row in ranking:
        assert float(row["gain"]) == pytest.approx(runs[row["arm"]].data.metrics["summary/eval_paired_gain"])
        assert float(row["gap_closed"]) == pytest.approx(runs[row["arm"]].data.metrics["summary/gap_closed"])
    assert (sweep_dir / "compare_gain.png").read_bytes()[:4] == b"\x89PNG"
