"""End to end against a real vLLM server running the fixture model: records, logprobs, MLflow."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import ROOT
from opd.records import MASK, check_group, read_groups
from helpers import Proxy, free_port, launch, mlflow_run
from opd.config import ConfigError
from opd.serving.vllm_client import ServerRequestError, VLLMClient

pytestmark = pytest.mark.vllm


def test_three_groups_line_up_with_the_server_and_land_in_mlflow(tmp_path, fixture_model, vllm_url) -> None:
    objective = launch(tmp_path, fixture_model, vllm_url, ["total_steps=3", "group_size=4"])
    groups = list(read_groups(tmp_path / "run" / "groups.jsonl"))
    assert len(groups) == 3
    for group in groups:
        assert check_group(group) == []
        assert len(group["tokens"]) == 4
    # The stored logprobs are the server's: rescoring the exact ids gives the same values.
    server = VLLMClient(vllm_url, fixture_model, timeout_s=60)
    tokens, masks, stored = groups[0]["tokens"][0], groups[0]["masks"][0], groups[0]["inference_logprobs"][0]

    async def rescore():
        try:
            return await server.score(tokens, 1)
        finally:
            await server.close()

    scored = asyncio.run(rescore())
    generated = [i for i, m in enumerate(masks) if m != MASK]
    assert generated and all(masks[i] == tokens[i] for i in generated)
    diffs = sorted(abs(scored.token_logprobs[i] - stored[i]) for i in generated)
    assert diffs[len(diffs) // 2] < 0.02 and diffs[-1] < 0.3, diffs[-5:]

    client, run = mlflow_run(tmp_path)
    assert run.info.status == "FINISHED"
    assert run.data.params["env.name"] == "inline_math" and run.data.params["total_steps"] == "3"
    assert run.data.tags["env"] == "inline_math" and run.data.tags["server"] == "vllm"
    # runner.groups_in_flight=null: 32 request slots x 1.5 / group_size 4.
    assert run.data.params["runner.groups_in_flight"] == "None" and run.data.tags["opd.groups_in_flight"] == "12"
    history = client.get_metric_history(run.info.run_id, "reward/mean")
    assert [m.step for m in history] == [1, 2, 3]
    accuracy = client.get_metric_history(run.info.run_id, "accuracy")
    assert objective == pytest.approx(sum(m.value for m in accuracy) / 3)  # not the reward: sweeps vary its weights
    assert {"accuracy", "tool_use_rate", "runner/groups_per_s", "reward/correct", "reward/format_violation"} <= set(run.data.metrics)
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "data")} | {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "data/groups.jsonl", "data/groups.html"} <= artifacts
    written = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())  # the resolved config
    assert written["env"]["name"] == "inline_math" and written["model"]["name"] == "fixture" and written["total_steps"] == 3


def test_evaluate_mode_logs_eval_metrics(tmp_path, fixture_model, vllm_url) -> None:
    accuracy = launch(tmp_path, fixture_model, vllm_url, ["mode=evaluate", "dataset.eval_size=8"])
    client, run = mlflow_run(tmp_path)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["eval/items"] == 8 and run.data.metrics["eval/failed_items"] == 0
    assert run.data.metrics["eval/accuracy"] == accuracy and 0 <= accuracy <= 1
    # The greedy rollouts as a table the UI shows: registered in the run's logged-artifacts tag, one row per item.
    assert {"path": "eval/samples_step_000000.json", "type": "table"} in json.loads(run.data.tags["mlflow.loggedArtifacts"])
    table = json.loads(Path(client.download_artifacts(run.info.run_id, "eval/samples_step_000000.json", str(tmp_path))).read_text())
    assert {"prompt", "response", "reward", "correct", "turns"} <= set(table["columns"]) and len(table["data"]) == 8
    row = dict(zip(table["columns"], table["data"][0]))
    assert row["prompt"] and isinstance(row["response"], str) and row["turns"] >= 1


def test_topk_rows_are_normalised_to_exactly_k(fixture_model, vllm_url, tokenizer) -> None:
    server = VLLMClient(vllm_url, fixture_model, timeout_s=60)
    ids = tokenizer.encode("<think>\nI will compute 2 + 3.\n</think> The answer is \\boxed{5}.")
    result = asyncio.run(server.score(ids, 5))  # a fresh loop: a fresh session
    assert result.top_ids[0] == [] and result.token_logprobs[0] is None
    for row_ids, row_lps, actual in zip(result.top_ids[1:], result.top_logprobs[1:], result.token_logprobs[1:]):
        assert len(row_ids) == len(row_lps) == 5
        assert row_lps == sorted(row_lps, reverse=True) and actual is not None and actual <= row_lps[0] + 1e-6


def test_scoring_only_the_rows_asked_for_gives_the_same_rows(fixture_model, vllm_url, tokenizer) -> None:
    # Teacher scoring reads only the student's turn: rows before `rows_from` are left empty.
    server = VLLMClient(vllm_url, fixture_model, timeout_s=60)
    ids = tokenizer.encode("<think>\nI will compute 2 + 3.\n</think> The answer is \\boxed{5}.")
    start = len(ids) // 2

    async def both():
        try:
            return await server.score(ids, 5), await server.score(ids, 5, rows_from=start)
        finally:
            await server.close()

    full, part = asyncio.run(both())
    assert part.top_ids[:start] == [[]] * start and part.token_logprobs[:start] == [None] * start
    assert len(part.top_ids) == len(part.top_logprobs) == len(part.token_logprobs) == len(ids)
    for position in range(start, len(ids)):
        assert part.token_logprobs[position] == pytest.approx(full.token_logprobs[position], abs=0.02)
        assert part.top_logprobs[position] == pytest.approx(full.top_logprobs[position], abs=0.02)
        # Ids agree except where near-equal logprobs may swap places between two scorings.
        assert sum(a != b for a, b in zip(part.top_ids[position], full.top_ids[position])) <= 2

    async def too_many() -> None:
        try:
            await server.score(ids, 21)
        finally:
            await server.close()

    with pytest.raises(ServerRequestError) as info:
        asyncio.run(too_many())
    assert info.value.status == 400 and not info.value.retryable and "max allowed: 20" in str(info.value)


def test_a_server_that_was_never_up_fails_the_run_within_seconds(tmp_path, fixture_model) -> None:
    """Not after server.unreachable_timeout_s (300 s): a server that never answered is a wrong
    address or one not started yet, said before anything starts."""
    dead = f"http://127.0.0.1:{free_port()}/v1"
    started = time.monotonic()
    with pytest.raises(ConfigError) as info:
        launch(tmp_path, fixture_model, dead, ["total_steps=1", "group_size=1"])
    assert info.value.key == "server.base_urls" and f"nothing answers at {dead}" in str(info.value)
    assert time.monotonic() - started < 30
    assert not (tmp_path / "mlflow.db").exists()  # nothing was started, no MLflow run either


@pytest.mark.slow
def test_readme_command_runs_with_the_embedded_server(tmp_path) -> None:
    """The README's main command as a user runs it: its own vLLM, stopped at the end."""
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.launch", "env=opd_coding", "distill_topk=20", "total_steps=2", "group_size=2", "env.max_turns=4",
         f"hydra.run.dir={run_dir}", f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
         f"tracking.artifact_root={tmp_path / 'mlruns'}", "runner.progress=false"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    groups = list(read_groups(run_dir / "groups.jsonl"))
    assert len(groups) == 2 and all(check_group(g) == [] and "distill_token_ids" in g for g in groups)
    log = (run_dir / "launch.log").read_text()
    assert "vLLM healthy after" in log and "vLLM stopped" in log
    # While it starts, the user reads how long it has taken, what vLLM is doing and where its log is.
    assert re.search(r"vLLM starting: \d+ s, [a-zA-Z' ]+ \(log: .*server\.log\)", log), log[-3000:]
    assert "finished:" in log and (run_dir / "summary.json").exists()
    assert "Application startup complete" in (run_dir / "vllm" / "server.log").read_text()
    port = re.search(r"starting vLLM on port (\d+)", log).group(1)
    leftover = subprocess.run(["pgrep", "-f", f"--port {port}"], capture_output=True, text=True)
    assert leftover.stdout.strip() == "", "the embedded vLLM outlived the run"


def test_bad_config_fails_before_any_server_starts(tmp_path) -> None:
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.launch", "reward.weights.tool_use=-1", f"hydra.run.dir={tmp_path}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "reward.weights.tool_use must be >= 0, got -1" in proc.stdout + proc.stderr
    assert not (tmp_path / "vllm").exists() and time.monotonic() - started < 60


@pytest.mark.slow
def test_two_servers_share_the_requests(tmp_path, fixture_model, vllm_url) -> None:
    """Two base URLs (two proxies in front of the session's server, each counting what it is sent):
    the choice of server is the client's, so one vLLM behind both tests it as two would."""
    first, second = Proxy(vllm_url), Proxy(vllm_url)
    try:
        launch(tmp_path, fixture_model, vllm_url, [
            f"server.base_urls=[{first.url},{second.url}]", "total_steps=4", "group_size=4", "runner.groups_in_flight=4",
        ])
    finally:
        first.close()
        second.close()
    served = [first.requests, second.requests]
    # atroposlib's ServerManager sends each request to the server with the most free slots.
    assert min(served) >= 4, served
    assert sum(served) >= 16, served
    assert len(list(read_groups(tmp_path / "run" / "groups.jsonl"))) == 4
