"""The closed loop on a real vLLM server: records line up with an HF forward pass of the weights
that made them, a refresh makes the server serve the trainer's weights, and a short run trains,
refreshes and evaluates in one MLflow run. The session server's own weights are put back after."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from conftest import compose
from opd.config import validate
from opd.records import read_groups

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
torch = pytest.importorskip("torch")


@pytest.fixture
def restores_the_fixture_weights(vllm_url: str, fixture_model: str):
    yield
    from opd.train.refresh import refresh

    asyncio.run(refresh([vllm_url], Path(fixture_model)))


def _launch(tmp_path: Path, fixture_model: str, url: str, overrides: list[str]) -> float:
    from experiments.launch import launch

    return launch(compose([
        "server=vllm", f"server.model={fixture_model}", f"server.base_urls=[{url}]", f"output_dir={tmp_path / 'run'}",
        f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", f"tracking.artifact_root={tmp_path / 'mlruns'}", "runner.progress=false", *overrides,
    ]))


def _hf_logprobs(model, tokens: list[int]) -> list[float]:
    from opd.train.losses import token_logprobs

    with torch.no_grad():
        ids = torch.tensor([tokens])
        return token_logprobs(model(input_ids=ids).logits, ids)[0][0].tolist()


def test_records_line_up_with_an_hf_forward_pass_of_the_generating_weights(tmp_path, fixture_model, vllm_url) -> None:
    from transformers import AutoModelForCausalLM

    _launch(tmp_path, fixture_model, vllm_url, ["env=inline_math", "total_steps=2", "group_size=4", "tracking.enabled=false"])
    model = AutoModelForCausalLM.from_pretrained(fixture_model, dtype=torch.float32)
    diffs, shifted = [], []
    for group in read_groups(tmp_path / "run" / "groups.jsonl"):
        for tokens, masks, lps in zip(group["tokens"], group["masks"], group["inference_logprobs"]):
            hf = _hf_logprobs(model, tokens)
            trained = [p for p, m in enumerate(masks) if m != -100 and p > 0]
            diffs += [abs(hf[p] - lps[p]) for p in trained]
            shifted += [abs(hf[p - 1] - lps[p]) for p in trained if p > 1]
    mean = sum(diffs) / len(diffs)
    # vLLM serves bf16, the trainer computes in float32: agreement at bf16's noise floor, far from
    # what a one-position shift gives.
    assert mean < 0.05 and sorted(diffs)[len(diffs) // 2] < 0.05, mean
    assert sum(shifted) / len(shifted) > 10 * mean


def test_a_refresh_makes_the_server_serve_the_trainers_weights(tmp_path, fixture_model, vllm_url, restores_the_fixture_weights) -> None:
    from opd.serving.vllm_client import VLLMClient
    from opd.train.refresh import refresh
    from opd.train.trainer import LocalTrainer

    trainer = LocalTrainer(validate(compose(["trainer=local"])).trainer, fixture_model)
    with torch.no_grad():  # move the weights visibly (a trainer step would, less)
        trainer.model.model.layers[0].mlp.down_proj.weight.mul_(3.0)
    weights = trainer.save(tmp_path / "weights")
    prompt = trainer._tokenizer.encode("<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n<think>\nI will compute", add_special_tokens=False)
    client = VLLMClient(vllm_url, fixture_model, timeout_s=60)

    async def served() -> list[float]:
        try:
            return (await client.score(prompt, 1)).token_logprobs[1:]
        finally:
            await client.close()

    before = asyncio.run(served())
    seconds = asyncio.run(refresh([vllm_url], weights))
    after = asyncio.run(served())
    hf_new = _hf_logprobs(trainer.model, prompt)[1:]
    assert seconds < 30
    assert sum(abs(a - b) for a, b in zip(after, before)) / len(after) > 0.05  # the served model changed...
    assert sum(abs(a - b) for a, b in zip(after, hf_new)) / len(after) < 0.05  # ...to the trainer's weights
    asyncio.run(refresh([vllm_url], Path(fixture_model)))
    assert sum(abs(a - b) for a, b in zip(asyncio.run(served()), before)) / len(before) < 0.02  # and back


def test_a_short_closed_loop_trains_refreshes_and_evaluates_in_one_run(tmp_path, fixture_model, vllm_url, restores_the_fixture_weights) -> None:
    import mlflow

    objective = _launch(tmp_path, fixture_model, vllm_url, [
        "env=inline_math", "trainer=local", "trainer.batch_groups=2", "total_steps=4", "group_size=4",
        "eval.every=2", "eval.max_items=6", "eval.samples_per_item=2", "runner.groups_in_flight=2",
    ])
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("inline_math").experiment_id])
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "trainer/loss")] == [2, 4]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "eval/sampled_accuracy")] == [0, 2, 4]
    assert {"trainer/kl_to_sampler", "trainer/clip_fraction", "trainer/grad_norm", "trainer/tokens_per_s", "trainer/refresh_s",
            "trainer/staleness_mean", "eval/accuracy"} <= set(run.data.metrics)
    assert any(name.startswith("eval/sampled_accuracy/") for name in run.data.metrics)  # per kind of problem
    assert run.data.metrics["summary/trainer_steps"] == 2 and run.data.tags["opd.objective"] == "summary/final_sampled_accuracy"
    assert run.data.metrics["summary/untrained_groups"] == 0 and run.data.metrics["summary/stale_groups_dropped"] == 0
    assert objective == pytest.approx(run.data.metrics["summary/final_sampled_accuracy"])
    versions = [g["group_overrides"]["weight_version"] for g in read_groups(tmp_path / "run" / "groups.jsonl")]
    assert len(versions) == 4 and versions[0] == 0 and max(versions) <= 2 and versions == sorted(versions)
    rows = [json.loads(line) for line in (tmp_path / "run" / "eval" / "step_000004.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and all({"item_id", "kind", "greedy_correct", "samples", "sampled_correct"} <= set(r) for r in rows)
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"final_weights", "eval"} <= artifacts
    assert "model.safetensors" in {Path(a.path).name for a in client.list_artifacts(run.info.run_id, "final_weights")}


def test_groups_that_never_fill_a_batch_or_are_too_stale_are_counted_not_lost_silently(tmp_path) -> None:
    from types import SimpleNamespace

    from opd.sinks.base import Written
    from opd.sinks.trainer import TrainerSink

    cfg = validate(compose(["trainer=local", "trainer.batch_groups=4", "trainer.max_staleness=1"])).trainer
    env = SimpleNamespace(weight_version=3)
    sink = TrainerSink(cfg, env=env, model_dir="unused", base_urls=[], out_dir=tmp_path, tracker=None)
    for step, version in enumerate([3, 2, 1, 0], start=1):  # two are more than one version old
        asyncio.run(sink.write(Written({"group_overrides": {"weight_version": version}}, step, {})))
    asyncio.run(sink.close("FINISHED"))
    assert sink.summary() == {"summary/trainer_steps": 0.0, "summary/stale_groups_dropped": 2.0, "summary/untrained_groups": 2.0,
                              "summary/weight_version": 3.0}


def test_a_closed_loop_starts_from_its_checkpoint_whatever_the_server_holds(tmp_path, fixture_model, vllm_url, restores_the_fixture_weights) -> None:
    # A sweep's shared server keeps the previous job's trained weights; the next job's trainer
    # puts the checkpoint back before anything is generated or evaluated.
    from opd.serving.vllm_client import VLLMClient
    from opd.sinks.trainer import TrainerSink
    from opd.train.refresh import refresh
    from opd.train.trainer import LocalTrainer
    from transformers import AutoTokenizer

    cfg = validate(compose(["trainer=local"])).trainer
    other = LocalTrainer(cfg, fixture_model)
    with torch.no_grad():
        other.model.model.layers[0].mlp.down_proj.weight.mul_(3.0)
    prompt = AutoTokenizer.from_pretrained(fixture_model).encode("<|im_start|>user\nHow many digits has 4096?<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)

    async def served() -> list[float]:
        client = VLLMClient(vllm_url, fixture_model, timeout_s=60)
        try:
            return (await client.score(prompt, 1)).token_logprobs[1:]
        finally:
            await client.close()

    def distance(a: list[float], b: list[float]) -> float:
        return sum(abs(x - y) for x, y in zip(a, b)) / len(a)

    checkpoint = asyncio.run(served())
    asyncio.run(refresh([vllm_url], other.save(tmp_path / "other")))
    assert distance(asyncio.run(served()), checkpoint) > 0.05
    sink = TrainerSink(cfg, env=None, model_dir=fixture_model, base_urls=[vllm_url], out_dir=tmp_path / "run", tracker=None)
    asyncio.run(sink.open())
    assert distance(asyncio.run(served()), checkpoint) < 0.02
