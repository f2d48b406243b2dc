"""mode=serve against the Atropos trainer API that ships in the atroposlib wheel, on loopback."""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import compose
from helpers import free_port, serving
from opd.records import read_groups

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

# Fields the API hands to a trainer; each must equal what groups.jsonl holds.
FIELDS = ("tokens", "masks", "scores", "inference_logprobs", "distill_token_ids", "distill_logprobs", "overrides", "messages")


def _call(method: str, url: str, body: dict | None = None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


@pytest.fixture()
def trainer_api(tmp_path: Path):
    """atroposlib's trainer API (`run-api`), ready once it answers."""
    with serving([str(Path(sys.executable).parent / "run-api")], tmp_path) as url:
        yield url


def test_serve_mode_hands_the_trainer_exactly_the_jsonl_groups_under_back_pressure(tmp_path: Path, fixture_model: str, vllm_url: str, trainer_api: str) -> None:
    from experiments.launch import launch

    # A trainer with a batch of one group (2 sequences); the env may keep at most one batch queued.
    _call("POST", trainer_api + "/register", {
        "wandb_group": "g", "wandb_project": "p", "batch_size": 2, "max_token_len": 4096,
        "checkpoint_dir": str(tmp_path), "save_checkpoint_interval": 0, "starting_step": 0, "num_steps": 10,
    })
    cfg = compose([
        "env=opd_coding", "mode=serve", "server=vllm", f"server.model={fixture_model}", f"server.base_urls=[{vllm_url}]",
        f"output_dir={tmp_path / 'run'}", f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", f"tracking.artifact_root={tmp_path / 'mlruns'}",
        "runner.progress=false", "total_steps=3", "group_size=2", "env.max_turns=2", "judge_votes=1", "runner.groups_in_flight=3",
        f"serve.rollout_server_url={trainer_api}", "serve.max_batches_offpolicy=1", "serve.poll_interval_s=0.2", "serve.wait_timeout_s=120",
    ])
    errors: list[BaseException] = []

    def run() -> None:
        try:
            launch(cfg)
        except BaseException as err:  # surfaced by the assertion below
            errors.append(err)

    worker = threading.Thread(target=run)
    # The API answers "wait for trainer to start" until the trainer asks for a batch; start late on purpose.
    worker.start()
    time.sleep(3)
    received: list[dict] = []
    most_queued = 0
    deadline = time.monotonic() + 600
    while (worker.is_alive() or _call("GET", trainer_api + "/status")["queue_size"]) and time.monotonic() < deadline:
        most_queued = max(most_queued, _call("GET", trainer_api + "/status")["queue_size"])
        batch = _call("GET", trainer_api + "/batch")["batch"]
        if batch:
            received += batch
        time.sleep(4.0)  # a slow trainer: the env must wait, not pile groups up
    worker.join(timeout=60)
    assert not errors, errors
    written = list(read_groups(tmp_path / "run" / "groups.jsonl"))
    assert len(written) == 3 and len(received) == 3
    assert most_queued <= 1
    for sent, got in zip(written, received):
        for field in FIELDS:
            assert got[field] == sent.get(field), field
        assert got["env_id"] == 0
    assert any(any(row for row in got["distill_token_ids"]) for got in received)
    import mlflow

    run = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").search_runs(["1"])[0]
    assert run.data.metrics["summary/serve_groups_sent"] == 3
    assert run.data.metrics["summary/serve_wait_s"] > 0  # it did wait for the trainer


def test_serve_mode_without_a_trainer_fails_clearly(tmp_path: Path, fixture_model: str, vllm_url: str) -> None:
    from experiments.launch import launch
    from opd.sinks.atropos import TrainerAPIError

    dead = f"http://127.0.0.1:{free_port()}"
    cfg = compose([
        "mode=serve", "server=vllm", f"server.model={fixture_model}", f"server.base_urls=[{vllm_url}]",
        f"output_dir={tmp_path / 'run'}", f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", f"tracking.artifact_root={tmp_path / 'mlruns'}",
        "runner.progress=false", "total_steps=1", f"serve.rollout_server_url={dead}", "serve.max_attempts=2",
    ])
    started = time.monotonic()
    with pytest.raises(TrainerAPIError, match="failed 2 times"):
        launch(cfg)
    assert time.monotonic() - started < 30
