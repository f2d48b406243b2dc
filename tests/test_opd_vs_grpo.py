"""experiment=opd_vs_grpo end to end at a tiny budget, on real vLLM (the session's fixture server,
which here also serves as the teacher through `teacher.server.base_url`: the plumbing, not a
stronger teacher): the three arms run as closed loops on teacher rows and experiments.compare
ranks them. Without a teacher, `arm=opd` is refused before it starts (tests/test_config.py)."""

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

TINY = ["sweep.seeds=1", "total_steps=2", "group_size=2", "trainer.batch_groups=1", "eval.every=1", "eval.max_items=4",
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
    teacher = [f"teacher.server.model={fixture_model}", f"teacher.server.base_url={vllm_url}"]
    proc, sweep_dir, uri = _sweep(tmp_path, fixture_model, vllm_url, ["experiment=opd_vs_grpo", *TINY, *teacher])
    assert proc.returncode == 0, proc.stderr[-3000:]
    client, (parent,), children = _runs(uri)
    assert parent.info.status == "FINISHED" and parent.data.tags["opd.swept"] == "arm"
    runs = {c.data.params["arm"]: c for c in children}
    assert set(runs) == {"grpo", "opd", "mix"} and all(c.info.status == "FINISHED" for c in children)
    expected = {"grpo": {"pg": 1.0, "opd_advantage": 0.0, "topk_kl": 0.0}, "opd": {"pg": 0.0, "opd_advantage": 1.0, "topk_kl": 0.0},
                "mix": {"pg": 1.0, "opd_advantage": 1.0, "topk_kl": 0.0}}
    for arm, run in runs.items():
        assert run.info.run_name == f"arm={arm}"
        assert {name: float(run.data.params[f"trainer.loss.{name}"]) for name in expected[arm]} == expected[arm]
        assert run.data.params["dataset.kinds"] == "None" and run.data.params["teacher.kind"] == "model"  # all nine kinds, one teacher
        assert [m.step for m in client.get_metric_history(run.info.run_id, "trainer/loss")] == [1, 2]
        assert [m.step for m in client.get_metric_history(run.info.run_id, "eval/sampled_accuracy")] == [0, 1, 2]
        assert run.data.tags["opd.objective"] == "summary/eval_paired_gain"
        assert run.data.metrics["objective"] == pytest.approx(run.data.metrics["summary/eval_paired_gain"])
    # Every arm's groups carry the teacher's rows on every sampled token, and the OPD arm's trainer
    # computes its term from them at each step. (Its value is 0 here: this teacher is the served
    # student itself; tests/test_teacher.py trains on a distinct teacher.)
    for arm, run in runs.items():
        coverage = [m.value for m in client.get_metric_history(run.info.run_id, "teacher/token_coverage")]
        assert len(coverage) == 2 and set(coverage) == {1.0}, (arm, coverage)
    assert [m.step for m in client.get_metric_history(runs["opd"].info.run_id, "trainer/loss_opd_advantage")] == [1, 2]
    # Every arm starts from the same checkpoint and seeded samples: their first evaluations agree.
    firsts = {arm: client.get_metric_history(run.info.run_id, "eval/sampled_accuracy")[0].value for arm, run in runs.items()}
    assert len(set(firsts.values())) == 1, firsts
    compared = subprocess.run([sys.executable, "-m", "experiments.compare", str(sweep_dir)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert compared.returncode == 0, compared.stderr[-2000:]
    assert "ranked by paired held-out gain" in compared.stdout and "best: arm=" in compared.stdout
    with (sweep_dir / "compare_gain.csv").open() as handle:
        ranking = list(csv.DictReader(handle))
    assert {r["arm"] for r in ranking} == {"grpo", "opd", "mix"} and all(r["seeds"] == "1" and r["items"] == "4" for r in ranking)
    for row in ranking:
        assert float(row["gain"]) == pytest.approx(runs[row["arm"]].data.metrics["summary/eval_paired_gain"])
    assert (sweep_dir / "compare_gain.png").read_bytes()[:4] == b"\x89PNG"
