"""opd_coding end to end against a real vLLM server running the fixture model."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import helpers
from opd.config import ConfigError
from opd.distill.teacher import with_hint
from opd.envs import coding_prompt
from opd.records import DISTILL_PAD_ID, MASK, check_group, read_groups
from opd.serving.vllm_client import VLLMClient
from opd.records.__main__ import check_file as validate_file

pytestmark = pytest.mark.vllm
K = 20
# One bf16 step for a logit in [8, 16) is 2**-4; logprobs within it count as equal.
BF16_STEP = 0.07


def launch(tmp_path: Path, fixture_model: str, url: str, overrides: list[str]) -> float:
    """An opd_coding run with the server's top-K (`overrides` last)."""
    return helpers.launch(tmp_path, fixture_model, url, ["env=opd_coding", f"distill_topk={K}", "server.max_logprobs=20", *overrides])


@pytest.fixture(scope="module")
def opd_run(tmp_path_factory: pytest.TempPathFactory, fixture_model: str, vllm_url: str) -> Path:
    tmp_path = tmp_path_factory.mktemp("opd")
    launch(tmp_path, fixture_model, vllm_url, ["total_steps=3", "group_size=4", "env.max_turns=6"])
    return tmp_path


def test_three_valid_groups_with_real_teacher_rows(opd_run: Path) -> None:
    path = opd_run / "run" / "groups.jsonl"
    count, problems = validate_file(path)
    assert count == 3 and problems == []
    groups = list(read_groups(path))
    scored_turns = [t for g in groups for d in g["overrides"] for t in d["opd_turns"] if t["scored"]]
    assert scored_turns, "no turn carries teacher rows"
    rows = [row for g in groups for seq in g["distill_token_ids"] for row in seq if row[0] != DISTILL_PAD_ID]
    assert rows and all(len(row) == K for row in rows)
    for group in groups:
        assert check_group(group) == []
        for detail in group["overrides"]:
            assert {"correctness", "efficiency", "tool_usage"} == set(detail["reward_signals"])


def test_mlflow_run_has_the_opd_metrics(opd_run: Path) -> None:
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{opd_run / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("opd_coding")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED"
    expected = {"opd/hint_rate", "opd/pair_hint_rate", "opd/mean_turns_scored", "opd/hints_per_rollout", "opd/pairs_judged", "opd/votes_unparseable", "opd/turns_scored",
                "opd/scoring_failures", "opd/teacher_minus_student_lp", "reward/correctness", "reward/efficiency", "reward/tool_usage"}
    assert expected <= set(run.data.metrics)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "opd/hint_rate")] == [1, 2, 3]


def test_stored_rows_equal_a_fresh_teacher_scoring(opd_run: Path, fixture_model: str, vllm_url: str, tokenizer) -> None:
    """Rebuild one hinted turn's teacher input from the file alone and ask the server again."""
    groups = list(read_groups(opd_run / "run" / "groups.jsonl"))
    group, seq, turn = next(
        (g, i, t) for g in groups for i, d in enumerate(g["overrides"]) for t in d["opd_turns"] if t["scored"]
    )
    start, end = turn["span"]
    # The teacher's prompt: the task's prompt again with the hint, then the record's own ids up to the turn.
    context = group["messages"][seq][: turn["message_index"]]
    first = next(p for p, m in enumerate(group["masks"][seq]) if m != MASK)
    prompt = tokenizer.apply_chat_template(with_hint(context[:2], turn["hint"], "last_user"), tools=coding_prompt.TOOLS, add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False) + group["tokens"][seq][first:start]
    student = group["tokens"][seq][start:end]
    server = VLLMClient(vllm_url, fixture_model, timeout_s=60)

    async def score():
        try:
            return await server.score(prompt_ids + student, K)
        finally:
            await server.close()

    fresh = asyncio.run(score())
    offset = len(prompt_ids)
    differences: list[float] = []
    for j, position in enumerate(range(start, end)):
        stored_ids, stored_lps = group["distill_token_ids"][seq][position], group["distill_logprobs"][seq][position]
        fresh_ids, fresh_lps = fresh.top_ids[offset + j], fresh.top_logprobs[offset + j]
        # The run scored this turn inside a batch of other requests, this lone request does not:
        # vLLM's kernels then round the bf16 logits differently, by up to one bf16 step.
        assert stored_lps == pytest.approx(fresh_lps, abs=BF16_STEP)
        differences += [abs(a - b) for a, b in zip(stored_lps, fresh_lps)]
        # Ids agree except where near-equal logprobs may swap order.
        assert sum(a != b for a, b in zip(stored_ids, fresh_ids)) <= K // 2
        assert stored_ids[0] == fresh_ids[0] or abs(stored_lps[0] - stored_lps[1]) < BF16_STEP
        assert group["overrides"][seq]["teacher_logprobs"][position] == pytest.approx(fresh.token_logprobs[offset + j], abs=BF16_STEP)
    # Rounding moves a few values; a row from the wrong position or context would move most of them.
    assert sum(differences) / len(differences) < 0.01
    # Positions just outside the turn carry no teacher rows.
    assert group["distill_token_ids"][seq][start - 1][0] == DISTILL_PAD_ID
    if end < len(group["tokens"][seq]):
        assert group["distill_token_ids"][seq][end][0] == DISTILL_PAD_ID


def test_topk_above_the_server_limit_is_a_clear_error(tmp_path: Path, fixture_model: str, vllm_url: str) -> None:
    # The schema accepts it (server.max_logprobs is what we were told); the server refuses it.
    with pytest.raises(ConfigError) as info:
        launch(tmp_path, fixture_model, vllm_url, ["distill_topk=21", "server.max_logprobs=21", "total_steps=1"])
    assert "distill_topk=21" in str(info.value) and "max allowed: 20" in str(info.value)


def test_judge_on_its_own_server_and_evaluate_mode(tmp_path: Path, fixture_model: str, vllm_url: str) -> None:
    import mlflow

    launch(tmp_path / "judge", fixture_model, vllm_url, [
        "total_steps=1", "group_size=2", "env.max_turns=3",
        "judge=server", f"judge.base_url={vllm_url}", f"judge.model={fixture_model}", "judge.votes_in_one_request=false",
    ])
    (group,) = read_groups(tmp_path / "judge" / "run" / "groups.jsonl")
    records = [t for d in group["overrides"] for t in d["opd_turns"]]
    assert records and all(len(t["votes"]) == 3 and t["error"] is None for t in records)

    accuracy = launch(tmp_path / "eval", fixture_model, vllm_url, ["mode=evaluate", "env.max_turns=4"])
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'eval' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("opd_coding").experiment_id])
    assert run.data.metrics["eval/items"] == 16 and run.data.metrics["eval/failed_items"] == 0
    assert run.data.metrics["eval/accuracy"] == accuracy


def _traces(tmp_path: Path):
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("opd_coding").experiment_id])
    return run, client.search_traces(locations=[run.info.experiment_id])


def test_tracing_gives_one_trace_per_rollout_with_its_calls(tmp_path: Path, fixture_model: str, vllm_url: str) -> None:
    launch(tmp_path, fixture_model, vllm_url, ["total_steps=2", "group_size=2", "env.max_turns=3", "judge_votes=2", "tracking.traces=true"])
    run, traces = _traces(tmp_path)
    assert len(traces) == 4
    for trace in traces:
        assert trace.info.request_metadata["mlflow.sourceRun"] == run.info.run_id
        names = [s.name for s in trace.data.spans]
        root = trace.data.spans[0]
        assert root.name == "rollout" and root.parent_id is None
        assert {s.parent_id for s in trace.data.spans[1:]} <= {s.span_id for s in trace.data.spans}
        assert names.count("generate") >= 1 and "task tests" in names
        assert root.outputs["score"] is not None
    spans = [s for t in traces for s in t.data.spans]
    assert any(s.name.startswith("tool ") for s in spans)
    assert any(s.name == "judge" for s in spans)  # judge votes land in the rollout's own trace


def test_tracing_is_off_above_its_rollout_limit(tmp_path: Path, fixture_model: str, vllm_url: str, caplog) -> None:
    launch(tmp_path, fixture_model, vllm_url, ["total_steps=1", "group_size=2", "env.max_turns=2", "tracking.traces=true", "tracking.traces_max_rollouts=1"])
    _, traces = _traces(tmp_path)
    assert traces == [] and "tracking.traces: off" in caplog.text
