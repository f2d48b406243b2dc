"""experiment=opd_vs_grpo end to end at a tiny budget, on real vLLM (the session's fixture server):
the GRPO and mix arms run as closed loops and are ranked by experiments.compare; the OPD arm, with
no teacher to write the rows its only loss term reads, is refused before it starts, alone."""

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
def test_the_experiment_runs_grpo_and_mix_refuses_opd_without_a_teacher_and_compare_ranks_the_arms(
        tmp_path: Path, fixture_model: str, vllm_url: str, restores_the_fixture_weights) -> None:
    proc, sweep_dir, uri = _sweep(tmp_path, fixture_model, vllm_url, ["experiment=opd_vs_grpo", *TINY])
    # The OPD arm fails its job with one line, before any MLflow run or server; the others run.
    assert proc.returncode != 0
    refusal = "trainer.loss: opd_advantage=1 needs teacher rows and env=inline_math without a teacher writes none"
    assert refusal in proc.stderr
    refused = sweep_dir / "1"  # the jobs run in the order of the sweep: grpo, opd, mix
    assert f"configuration error: {refusal}" in (refused / "launch.log").read_text()
    assert not (refused / "groups.jsonl").exists() and not (refused / "vllm").exists()
    client, (parent,), children = _runs(uri)
    assert parent.info.status == "FAILED" and parent.data.tags["opd.swept"] == "arm"
    runs = {c.data.params["arm"]: c for c in children}
    assert set(runs) == {"grpo", "mix"} and all(c.info.status == "FINISHED" for c in children)
    for arm, run in runs.items():
        assert run.info.run_name == f"arm={arm}"
        weights = {name: float(run.data.params[f"trainer.loss.{name}"]) for name in ("pg", "opd_advantage", "topk_kl")}
        assert weights == {"grpo": {"pg": 1.0, "opd_advantage": 0.0, "topk_kl": 0.0}, "mix": {"pg": 1.0, "opd_advantage": 1.0, "topk_kl": 0.0}}[arm]
        assert run.data.params["dataset.kinds"] == "None"  # all nine kinds
        assert [m.step for m in client.get_metric_history(run.info.run_id, "trainer/loss")] == [1, 2]
        assert [m.step for m in client.get_metric_history(run.info.run_id, "eval/sampled_accuracy")] == [0, 1, 2]
        assert run.data.tags["opd.objective"] == "summary/eval_paired_gain"
        assert run.data.metrics["objective"] == pytest.approx(run.data.metrics["summary/eval_paired_gain"])
    # Both arms start from the same checkpoint and seeded samples: their first evaluations agree.
    firsts = {arm: client.get_metric_history(run.info.run_id, "eval/sampled_accuracy")[0].value for arm, run in runs.items()}
    assert firsts["grpo"] == firsts["mix"]
    compared = subprocess.run([sys.executable, "-m", "experiments.compare", str(sweep_dir)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert compared.returncode == 0, compared.stderr[-2000:]
    assert "ranked by paired held-out gain" in compared.stdout and "best: arm=" in compared.stdout
    with (sweep_dir / "compare_gain.csv").open() as handle:
        ranking = list(csv.DictReader(handle))
    assert {r["arm"] for r in ranking} == {"grpo", "mix"} and all(r["seeds"] == "1" and r["items"] == "4" for r in ranking)
    for row in ranking:
        assert float(row["gain"]) == pytest.approx(runs[row["arm"]].data.metrics["summary/eval_paired_gain"])
    assert (sweep_dir / "compare_gain.png").read_bytes()[:4] == b"\x89PNG"
