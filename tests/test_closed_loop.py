"""The closed loop on a real vLLM server: records line up with an HF forward pass of the weights
that made them, a refresh makes the server serve the trainer's weights (every tensor, the output
layer included; a server that kept an old output layer fails the refresh check), and a short run
trains, refreshes, checks and evaluates in one MLflow run. The session server serves an untied copy
of the fixture (conftest.py), as a closed loop's server does; its weights are put back after."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import compose
from helpers import launch
from opd.config import validate
from opd.records import read_groups

# Every test here but the trainer sink's bookkeeping takes `vllm_url`, which puts it in the vllm
# tier (tests/conftest.py); that one is fast.
torch = pytest.importorskip("torch")


@pytest.fixture
def restores_the_fixture_weights(vllm_url: str, untied_fixture: str):
    yield
    from opd.train.refresh import refresh

    asyncio.run(refresh([vllm_url], Path(untied_fixture)))


def _served(url: str, model: str, ids: list[int]) -> list[float | None]:
    """The server's prompt logprob of each of `ids` (None at position 0)."""
    from opd.serving.vllm_client import VLLMClient

    async def score() -> list[float | None]:
        client = VLLMClient(url, model, timeout_s=60)
        try:
            return (await client.score(ids, 1)).token_logprobs
        finally:
            await client.close()

    return asyncio.run(score())


def _perturb_every_tensor(model, scale: float = 0.3, seed: int = 0) -> list[str]:
    """Add noise of `scale` x each tensor's own spread to every parameter (the tied embedding and
    output layer included); the names changed."""
    generator = torch.Generator().manual_seed(seed)
    changed = []
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            spread = parameter.std() if parameter.numel() > 1 and float(parameter.std()) > 0 else parameter.abs().mean() + 1e-3
            parameter.add_(torch.randn(parameter.shape, generator=generator) * scale * spread)
            changed.append(name)
    return changed


def _hf_logprobs(model, tokens: list[int]) -> list[float]:
    from opd.train.losses import token_logprobs

    with torch.no_grad():
        ids = torch.tensor([tokens])
        return token_logprobs(model(input_ids=ids).logits, ids)[0][0].tolist()


def test_records_line_up_with_an_hf_forward_pass_of_the_generating_weights(tmp_path, fixture_model, vllm_url) -> None:
    from transformers import AutoModelForCausalLM

    launch(tmp_path, fixture_model, vllm_url, ["env=inline_math", "total_steps=2", "group_size=4", "tracking.enabled=false"])
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


def test_a_refresh_of_every_tensor_serves_the_trainers_weights_output_layer_included(tmp_path, fixture_model, untied_fixture, vllm_url,
                                                                                     restores_the_fixture_weights) -> None:
    import copy

    from opd.train.refresh import refresh
    from opd.train.refresh_check import SLACK, mean_abs, probe_ids
    from opd.train.trainer import LocalTrainer

    cfg = validate(compose(["trainer=local"])).trainer
    trainer = LocalTrainer(cfg, fixture_model)
    ids = probe_ids(trainer.tokenizer, cfg.refresh_check.tokens)
    before = _served(vllm_url, fixture_model, ids)
    floor = mean_abs(before, trainer.probe_logprobs(ids, "bfloat16"))  # same weights: bf16 serving vs the float32 trainer
    assert 0 < floor < 0.05, floor
    old_head = trainer.model.get_output_embeddings().weight.detach().clone()
    changed = _perturb_every_tensor(trainer.model)
    assert {"model.embed_tokens.weight", "model.norm.weight", "model.layers.0.mlp.down_proj.weight"} <= set(changed)
    assert len(changed) == len(list(trainer.model.parameters()))
    seconds = asyncio.run(refresh([vllm_url], trainer.save(tmp_path / "weights")))
    after = _served(vllm_url, fixture_model, ids)
    trained = trainer.probe_logprobs(ids, "bfloat16")
    limit = cfg.refresh_check.tolerance * floor + SLACK  # what the run's refresh check accepts
    assert seconds < 30
    assert mean_abs(after, [b or 0.0 for b in before]) > 0.2  # the served model changed...
    assert mean_abs(after, trained) < limit, (mean_abs(after, trained), floor)  # ...to the trainer's weights, within the noise floor
    # The same comparison tells a server that kept its old output layer apart: new body + old head.
    hybrid = copy.deepcopy(trainer.model)
    hybrid.config.tie_word_embeddings = False
    hybrid.lm_head.weight = torch.nn.Parameter(old_head)
    with torch.no_grad():
        hybrid_lps = _hf_logprobs(hybrid, ids)
    # A stale head is 0.30 nats off here, the check's limit 0.045 (3 x a floor of 0.014, + slack):
    # it fails the check with room to spare.
    assert mean_abs([None, *hybrid_lps[1:]], trained) > 4 * limit
    asyncio.run(refresh([vllm_url], Path(untied_fixture)))
    assert mean_abs(_served(vllm_url, fixture_model, ids), [b or 0.0 for b in before]) < 0.005  # and back


def test_a_server_that_keeps_its_old_output_layer_fails_the_refresh_check(tmp_path, fixture_model, vllm_url, restores_the_fixture_weights) -> None:
    # A tied checkpoint has no lm_head.weight: the reload refreshes the body and leaves the served
    # output layer as it was, the hybrid a tied model's server runs after every in-place reload.
    from opd.train.refresh import refresh
    from opd.train.refresh_check import RefreshCheck, RefreshMismatch
    from opd.train.trainer import LocalTrainer

    cfg = validate(compose(["trainer=local"])).trainer
    trainer = LocalTrainer(cfg, fixture_model)
    check = RefreshCheck(cfg.refresh_check, [vllm_url], fixture_model, trainer.tokenizer)
    floor = asyncio.run(check.start(trainer.probe_logprobs))
    with torch.no_grad():  # the embedding only (tied: the output layer moves with it)
        embedding = trainer.model.get_input_embeddings().weight
        embedding.add_(torch.randn(embedding.shape, generator=torch.Generator().manual_seed(1)) * 0.3 * embedding.std())
    trainer.model.save_pretrained(tmp_path / "tied")  # the tied form: no lm_head.weight in the file
    asyncio.run(refresh([vllm_url], tmp_path / "tied"))
    with pytest.raises(RefreshMismatch, match=r"does not serve the trainer's weights.*without its own output layer.*untied copy") as caught:
        asyncio.run(check.after_refresh(trainer.probe_logprobs, 1))
    assert f"{floor:.4f}" in str(caught.value) and vllm_url in str(caught.value)
    # The untied checkpoint of the same weights passes.
    asyncio.run(refresh([vllm_url], trainer.save(tmp_path / "untied")))
    assert asyncio.run(check.after_refresh(trainer.probe_logprobs, 2)) <= check.limit


def test_a_short_closed_loop_trains_refreshes_and_evaluates_in_one_run(tmp_path, fixture_model, vllm_url, restores_the_fixture_weights) -> None:
    import mlflow

    objective = launch(tmp_path, fixture_model, vllm_url, [
        "env=inline_math", "trainer=local", "trainer.batch_groups=2", "total_steps=4", "group_size=4",
        "eval.every=2", "eval.max_items=6", "eval.samples_per_item=2", "runner.groups_in_flight=2",
        "trainer.equal_score_groups=keep",  # a step per batch, even of groups the fixture scores all the same
    ])
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("inline_math").experiment_id])
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "trainer/loss")] == [2, 4]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "eval/sampled_accuracy")] == [0, 2, 4]
    # The served weights are checked at the start and after every refresh, within the start's noise floor.
    checks = client.get_metric_history(run.info.run_id, "trainer/refresh_check")
    assert [m.step for m in checks] == [0, 2, 4]
    assert all(m.value <= run.data.metrics["trainer/refresh_check_limit"] for m in checks)
    assert {"trainer/kl_to_sampler", "trainer/clip_fraction", "trainer/grad_norm", "trainer/tokens_per_s", "trainer/refresh_s",
            "trainer/staleness_mean", "trainer/ratio_mean", "trainer/ratio_max", "trainer/server_request_errors", "eval/accuracy",
            "eval/server_request_errors", "summary/refresh_check_max", "summary/equal_score_groups_dropped"} <= set(run.data.metrics)
    assert run.data.metrics["trainer/ratio_max"] >= run.data.metrics["trainer/ratio_mean"] > 0
    assert any(name.startswith("eval/sampled_accuracy/") for name in run.data.metrics)  # per kind of problem
    assert any(name.startswith("eval/sampled_format_violation_rate/") for name in run.data.metrics)
    low, gain, high = (run.data.metrics[f"summary/eval_paired_gain{end}"] for end in ("_low", "", "_high"))
    assert low <= gain <= high and 0 <= run.data.metrics["summary/eval_paired_p"] <= 1
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

    from opd.sinks.base import Written
    from opd.sinks.trainer import TrainerSink

    cfg = validate(compose(["trainer=local", "trainer.batch_groups=4", "trainer.max_staleness=1"])).trainer
    from opd.serving.weights import ServedWeights

    env = SimpleNamespace(served_weights=ServedWeights(3))
    sink = TrainerSink(cfg, env=env, model_dir="unused", base_urls=[], out_dir=tmp_path, tracker=None)
    for step, version in enumerate([3, 2, 1, 0], start=1):  # two are more than one version old
        asyncio.run(sink.write(Written({"group_overrides": {"weight_version": version}}, step, {})))
    asyncio.run(sink.close("FINISHED"))
    assert sink.summary() == {"summary/trainer_steps": 0.0, "summary/stale_groups_dropped": 2.0, "summary/untrained_groups": 2.0,
                              "summary/weight_version": 3.0, "summary/equal_score_groups_dropped": 0.0, "summary/trainer_empty_batches": 0.0}


def test_the_served_weights_version_has_one_owner_the_trainer_raises_it_and_the_environment_reads_it(tmp_path) -> None:

    from opd.serving.weights import ServedWeights
    from opd.sinks.base import Written
    from opd.sinks.trainer import TrainerSink

    cfg = validate(compose(["trainer=local", "trainer.batch_groups=1", "trainer.refresh=false"])).trainer
    served = ServedWeights()
    env = SimpleNamespace(served_weights=served, request_errors=0)
    sink = TrainerSink(cfg, env=env, model_dir="unused", base_urls=[], out_dir=tmp_path, tracker=None)
    metrics = {"trainer/equal_score_groups_dropped": 0.0, "trainer/loss": 0.0, "trainer/kl_to_sampler": 0.0, "trainer/ratio_max": 1.0, "trainer/step_s": 0.0}
    sink.trainer = SimpleNamespace(step=lambda groups: dict(metrics), save=lambda path: path)
    for step in (1, 2):
        asyncio.run(sink.write(Written({"group_overrides": {"weight_version": served.version}}, step, {})))
    assert served.version == 2 and sink.served_weights is served  # one object: what the env records from is what the trainer raised
    assert [h["trainer/weight_version"] for h in sink.history] == [1.0, 2.0]
    worker_copy = ServedWeights()
    worker_copy.follow(served.version)  # an environment worker follows the driver's version
    assert worker_copy.version == 2


def test_a_closed_loop_starts_from_its_checkpoint_whatever_the_server_holds(tmp_path, fixture_model, vllm_url, restores_the_fixture_weights) -> None:
    # A sweep's shared server keeps the previous job's trained weights; the next job's trainer
    # puts the checkpoint back before anything is generated or evaluated.
    from opd.serving.vllm_client import VLLMClient
    from opd.serving.weights import ServedWeights
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
    # Opening the sink needs only the served weights' owner of the environment.
    env = SimpleNamespace(served_weights=ServedWeights())
    sink = TrainerSink(cfg, env=env, model_dir=fixture_model, base_urls=[vllm_url], out_dir=tmp_path / "run", tracker=None)
    asyncio.run(sink.open())
    assert distance(asyncio.run(served()), checkpoint) < 0.02


def test_two_evaluations_of_the_same_weights_give_the_same_per_item_results(tmp_path, fixture_model, vllm_url) -> None:
    # Each sampled request carries a seed derived from eval.seed, the item and the sample, so the
    # random stream is the evaluation's, not the server's: the same weights give the same rows.
    rows = []
    for name in ("first", "second"):
        launch(tmp_path / name, fixture_model, vllm_url, ["env=inline_math", "mode=evaluate", "eval.max_items=10", "eval.samples_per_item=4",
                                                           "tracking.enabled=false", "dataset.kinds=[digit_count,parity]"])
        rows.append((tmp_path / name / "run" / "eval" / "step_000000.jsonl").read_text())
    assert rows[0] == rows[1]
    assert sum(json.loads(line)["samples"] for line in rows[0].splitlines()) == 40
    # Unseeded, the same two evaluations draw different streams (what the seed removes).
    unseeded = []
    for name in ("third", "fourth"):
        launch(tmp_path / name, fixture_model, vllm_url, ["env=inline_math", "mode=evaluate", "eval.max_items=10", "eval.samples_per_item=4",
                                                           "tracking.enabled=false", "dataset.kinds=[digit_count,parity]", "eval.seed=null"])
        unseeded.append((tmp_path / name / "run" / "eval" / "step_000000.jsonl").read_text())
    assert unseeded[0] != unseeded[1] or unseeded[0] != rows[0]


def test_many_seeded_requests_with_long_prompts_leave_the_server_up_and_repeat_exactly(fixture_model, vllm_url, tokenizer) -> None:
    # 24 prompts of ~1,500 tokens at once exceed one engine step's budget: with chunked prefill on
    # vLLM's CPU build, a seeded request's split prefill killed the engine ("CPU Generator does not
    # use offset"); the test server runs as a seeded evaluation's does (opd.serving.lifecycle.whole_prefill_args).
    from opd.serving.vllm_client import VLLMClient
    from opd.serving.watch import healthy

    base = tokenizer.encode("<|im_start|>user\\nHow many digits has 12345?<|im_end|>\\n", add_special_tokens=False)
    prompts = [[*(base * 100)[: 1500 - len(base)], *base][:1500] for _ in range(24)]
    prompts = [p[:1400 + i] for i, p in enumerate(prompts)]  # distinct lengths, no shared cache entry

    async def sample_all() -> list[list[int]]:
        client = VLLMClient(vllm_url, fixture_model, timeout_s=300)
        try:
            gens = await asyncio.gather(*(client.generate(p, max_tokens=24, temperature=1.0, seed=1000 + i) for i, p in enumerate(prompts)))
            return [g[0].token_ids for g in gens]
        finally:
            await client.close()

    first = asyncio.run(sample_all())
    assert healthy(vllm_url) and all(first)
    assert asyncio.run(sample_all()) == first  # the same seeds, the same samples, whatever the batching
