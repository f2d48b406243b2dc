"""Evaluation (opd/sinks/evaluation.py, RolloutEnv.evaluate): seeded requests, per-kind rates, the
paired comparison of two evaluations. With a scripted server; the real one is in test_closed_loop.py."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from conftest import compose
from opd.config import validate
from opd.data.sources import TaskSet
from scripted import ScriptedClient, build_env, text_generator

CALL = '<think>\nI count.\n<tool_call>\n{"name": "calculator", "arguments": {"expr": "2 + 3"}}\n</tool_call>'
ANSWER = "\n</think>\n\nThe answer is \\boxed{5}.<|im_end|>"
NO_THINK = "The answer is \\boxed{7}.<|im_end|>"


def _env(fixture_model: str, tokenizer, replies: list[tuple[str, str]] | None = None):
    """inline_math over a scripted server: `replies` in order, or (None) a tool call for a fresh
    prompt and the answer once the tool's response is in it: two requests per rollout, whatever
    the order the concurrent rollouts go in."""
    call, answer = (tokenizer.encode(text, add_special_tokens=False) for text in (CALL, ANSWER))
    shortest: list[int] = []  # every item has the same prompt: the shortest is a fresh one

    def two_requests(prompt_ids: list[int], *, max_tokens: int, stop: list[str] | None = None):
        from opd.serving.vllm_client import Generation

        shortest[:] = [min([len(prompt_ids), *shortest])]
        ids = (call if len(prompt_ids) == shortest[0] else answer)[:max_tokens]
        return Generation(ids, [-0.5] * len(ids), "stop")

    client = ScriptedClient(generate=text_generator(tokenizer, replies) if replies is not None else two_requests)
    items = [{"id": f"e{i}", "problem": "What is 2 + 3?", "answer": "5", "kind": "sum" if i % 2 else "parity"} for i in range(4)]
    cfg = validate(compose(["group_size=1"]))
    env = build_env(cfg, TaskSet(train=items, eval=items, source="test"), fixture_model, client)
    return env, client


def test_each_request_is_seeded_by_item_sample_and_position_and_a_repeat_draws_the_same_seeds(fixture_model, tokenizer) -> None:
    # Every rollout: a tool call, then the answer (two requests). 4 items x (greedy + 2 samples).
    seen = []
    for _ in range(2):
        env, client = _env(fixture_model, tokenizer)
        report = asyncio.run(env.evaluate(concurrency=5, samples_per_item=2, seed=0))
        asyncio.run(env.close())
        assert report.metrics["eval/failed_rollouts"] == 0
        seen.append(Counter(client.seeds))
    assert seen[0] == seen[1]  # the same seeds, whatever order the concurrent requests went in
    seeds = list(seen[0].elements())
    assert len(seeds) == 24 and len(set(seeds)) == 24 and all(isinstance(s, int) and 0 <= s < 2**31 for s in seeds)
    env, client = _env(fixture_model, tokenizer)
    asyncio.run(env.evaluate(concurrency=5, samples_per_item=2, seed=1))
    asyncio.run(env.close())
    assert not set(client.seeds) & set(seeds)  # another eval.seed, another stream
    env, client = _env(fixture_model, tokenizer)
    asyncio.run(env.evaluate(concurrency=5, samples_per_item=2, seed=None))
    asyncio.run(env.close())
    assert client.seeds == [None] * 24  # unseeded: the server's own randomness


def test_the_request_seeds_of_a_rollout_depend_on_item_sample_and_position() -> None:
    from itertools import islice

    from opd.envs.base import request_seeds

    first = list(islice(request_seeds(0, "e1", 0), 3))
    assert first == list(islice(request_seeds(0, "e1", 0), 3))
    assert len(set(first)) == 3
    others = [list(islice(request_seeds(*parts), 3)) for parts in ((1, "e1", 0), (0, "e2", 0), (0, "e1", 1), (0, "e1", "greedy"))]
    assert all(not set(first) & set(o) for o in others)


def test_format_violations_and_the_envs_rates_are_reported_per_kind(fixture_model, tokenizer) -> None:
    # Parity items (e0, e2) answer without </think>: a format violation; sum items (e1, e3) do not.
    from opd.envs.base import ItemResult
    from opd.envs.inline_math import Rollout
    from opd.records import Sequence

    env, _ = _env(fixture_model, tokenizer, [])
    answers = {"e0": NO_THINK, "e1": "<think>ok" + ANSWER, "e2": NO_THINK, "e3": "<think>ok" + ANSWER}

    async def scored_answer(item, temperature):
        rollout = Rollout(Sequence.from_prompt([1]), text=answers[item["id"]], written=answers[item["id"]])
        scored = await env.score(rollout, item["answer"])
        return ItemResult(bool(scored.signals["correct"]), scored.total, {"format_violation_rate": scored.signals["format_violation"]})

    env.eval_item = scored_answer
    report = asyncio.run(env.evaluate(concurrency=4, samples_per_item=2, seed=0))
    asyncio.run(env.close())
    m = report.metrics
    assert m["eval/sampled_format_violation_rate/parity"] == 1.0 and m["eval/sampled_format_violation_rate/sum"] == 0.0
    assert m["eval/format_violation_rate/parity"] == 1.0 and m["eval/format_violation_rate/sum"] == 0.0
    assert m["eval/sampled_accuracy/sum"] == 1.0 and m["eval/sampled_format_violation_rate"] == 0.5


def _rows(accuracies: list[float], samples: int = 8) -> list[dict]:
    return [{"item_id": f"i{i}", "samples": samples, "sampled_correct": round(a * samples)} for i, a in enumerate(accuracies)]


def test_the_paired_gain_comes_with_a_bootstrap_interval_over_items() -> None:
    from opd.sinks.evaluation import paired_change

    before = [0.25, 0.5, 0.0, 0.75, 0.5, 0.25, 0.125, 0.375] * 5
    after = [a + d for a, d in zip(before, [0.125, 0.125, 0.0, 0.25, -0.125, 0.125, 0.25, 0.0] * 5)]
    out = paired_change(_rows(before), _rows(after))
    assert out["summary/eval_paired_items"] == 40 and out["summary/eval_paired_gain"] == pytest.approx(0.09375)
    assert out["summary/eval_paired_gain_low"] < 0.09375 < out["summary/eval_paired_gain_high"]
    assert 0 < out["summary/eval_paired_gain_low"] and out["summary/eval_paired_p"] < 0.01  # a clear rise
    assert paired_change(_rows(before), _rows(after)) == out  # a fixed bootstrap seed: the same rows, the same interval
    wider = paired_change(_rows(before), _rows(after), confidence=0.99)
    assert wider["summary/eval_paired_gain_low"] < out["summary/eval_paired_gain_low"] and wider["summary/eval_paired_gain_high"] > out["summary/eval_paired_gain_high"]
    # Half the items: a wider interval around the same gain.
    half = paired_change(_rows(before[:20]), _rows(after[:20]))
    assert half["summary/eval_paired_gain_high"] - half["summary/eval_paired_gain_low"] > out["summary/eval_paired_gain_high"] - out["summary/eval_paired_gain_low"]
    # No change: gain 0, interval [0, 0], p = 1.
    same = paired_change(_rows(before), _rows(before))
    assert (same["summary/eval_paired_gain"], same["summary/eval_paired_gain_low"], same["summary/eval_paired_gain_high"], same["summary/eval_paired_p"]) == (0, 0, 0, 1)


def test_the_held_out_reverse_kl_change_is_paired_by_item_with_an_interval() -> None:
    """summary/reverse_kl_change: the mean per-item change of the items' sampled reverse KL to the
    teacher, over the items that have it first and last, with a bootstrap interval over items."""
    from opd.sinks.evaluation import paired_kl_change

    def rows(kls: list[float | None]) -> list[dict]:
        return [{"item_id": f"i{i}", "samples": 8, "sampled_correct": 0, **({} if kl is None else {"sampled_reverse_kl_to_teacher": kl})}
                for i, kl in enumerate(kls)]

    before = [0.6, 0.8, 0.4, 0.7] * 10
    after = [b + d for b, d in zip(before, [-0.2, -0.1, 0.0, -0.1] * 10)]
    out = paired_kl_change(rows(before), rows(after))
    assert out["summary/reverse_kl_change_items"] == 40 and out["summary/reverse_kl_change"] == pytest.approx(-0.1)
    assert out["summary/reverse_kl_change_low"] < -0.1 < out["summary/reverse_kl_change_high"] < 0  # a clear fall
    # An item without a KL on either side is left out of the pairing, not counted as a zero change.
    gaps = paired_kl_change(rows([None, *before[1:]]), rows([*after[:3], None, *after[4:]]))
    assert gaps["summary/reverse_kl_change_items"] == 38
    # Rows without any KL (a run with no teacher model): nothing to report.
    assert paired_kl_change(rows([None] * 4), rows([None] * 4)) == {}


def test_each_items_row_keeps_the_mean_of_its_own_samples_values() -> None:
    """An item's row has the mean over its own samples of each sampled value (the reverse KL to the
    teacher), not the evaluation's mean; a failed sample (None) is left out of its item's mean."""
    from opd.envs.base import ItemResult, _report

    def sample(kl: float) -> ItemResult:
        return ItemResult(False, 0.0, {"reverse_kl_to_teacher": kl})

    items = [{"id": "a"}, {"id": "b"}]
    results = [[ItemResult(False, 0.0), sample(0.2), sample(0.4)], [ItemResult(False, 0.0), sample(1.0), None]]
    report = _report(items, results, 2)
    assert [row["sampled_reverse_kl_to_teacher"] for row in report.items] == pytest.approx([0.3, 1.0])
    assert report.metrics["eval/sampled_reverse_kl_to_teacher"] == pytest.approx((0.2 + 0.4 + 1.0) / 3)
