"""inline_math with a scripted server: token bookkeeping, masking of inserted tool text, rewards.

The scripted server returns fixed token ids, so these tests pin the environment's logic; the
real-server behaviour is covered in test_launch_vllm.py.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from conftest import compose
from opd.config import validate
from opd.data.sources import TaskSet
from opd.records import MASK, MASKED_LOGPROB, check_group
from scripted import ScriptedClient, build_env, text_generator


@pytest.fixture
def make_env(fixture_model: str, tokenizer):
    made: list[ScriptedClient] = []

    def build(script: list[tuple[str, str]], overrides: list[str] | None = None):
        client = ScriptedClient(generate=text_generator(tokenizer, script))
        made.append(client)
        cfg = validate(compose(["group_size=1", *(overrides or [])]))
        data = TaskSet(train=[{"id": "t0", "problem": "What is 2 + 3?", "answer": "5"}], eval=[], source="test")
        env = build_env(cfg, data, fixture_model, client)
        env.client = client
        return env

    return build


CALL = '<think>\nI will compute 2 + 3.\n<tool_call>\n{"name": "calculator", "arguments": {"expr": "2 + 3"}}\n</tool_call>'
ANSWER = "The tool gives 5.\n</think>\n\nThe answer is \\boxed{5}.<|im_end|>"


def collect(env) -> dict:
    item = asyncio.run(env.get_next_item())
    group, _ = asyncio.run(env.collect_trajectories(item))
    return group


def test_tool_response_is_inserted_masked_and_generation_continues(make_env, tokenizer) -> None:
    env = make_env([(CALL, "stop"), (ANSWER, "stop")])
    group = collect(env)
    assert check_group(group) == []
    tokens, masks, logprobs = group["tokens"][0], group["masks"][0], group["inference_logprobs"][0]
    prompt = env.client.prompts[0]
    # The second request continues from exactly: prompt + sampled ids + inserted response ids.
    second = env.client.prompts[1]
    assert second == tokens[: len(second)] and second[: len(prompt)] == prompt
    call_ids = tokenizer.encode(CALL, add_special_tokens=False)
    assert tokens[len(prompt) : len(prompt) + len(call_ids)] == call_ids
    inserted = tokens[len(prompt) + len(call_ids) : len(second)]
    assert json.loads(tokenizer.decode(inserted).split("<tool_response>")[1].split("</tool_response>")[0]) == {"value": 5}
    # Prompt and inserted response: masked, placeholder logprob; sampled ids: trained with their logprobs.
    for position, (token, mask, lp) in enumerate(zip(tokens, masks, logprobs)):
        generated = position >= len(prompt) and not (len(prompt) + len(call_ids) <= position < len(second))
        assert (mask, lp) == ((token, -0.25) if generated else (MASK, MASKED_LOGPROB)), position
    # </tool_call> appears once: the sampled id, not appended again.
    assert tokens[len(prompt) :].count(tokenizer.convert_tokens_to_ids("</tool_call>")) == 1
    assert group["scores"] == [pytest.approx(1.2)]
    # Raw signal values (the weights make the score): correct, with a tool, well formed.
    assert group["overrides"][0]["reward_signals"] == {"correct": 1.0, "incorrect": 0.0, "tool_use": 1.0, "format_violation": 0.0}
    # What the viewer shows, as the env says it: its name, and the rollout passed with one tool call.
    assert group["group_overrides"]["env"] == "inline_math" and group["overrides"][0]["passed"] is True and group["overrides"][0]["tool_calls"] == 1
    # Whether it passed is recorded once (`passed`, the rubric's), and the env's own metric reads it.
    assert "correct" not in group["overrides"][0] and env.group_metrics(group)["train/percent_correct"] == 1.0


def test_malformed_call_gets_an_error_result_and_the_rollout_goes_on(make_env, tokenizer) -> None:
    bad = "<think>\n<tool_call>\n{'name': 'calculator'}\n</tool_call>"
    env = make_env([(bad, "stop"), (ANSWER, "stop")])
    group = collect(env)
    details = group["overrides"][0]
    assert details["tool_calls"] == 0 and details["tool_errors"] == 1
    assert "not valid JSON" in tokenizer.decode(group["tokens"][0])
    assert group["scores"] == [1.0]  # correct answer, but no tool ran: no bonus


def test_hostile_calculator_input_is_an_error_result(make_env, tokenizer) -> None:
    hostile = '<think>\n<tool_call>\n{"name": "calculator", "arguments": {"expr": "().__class__.__base__"}}\n</tool_call>'
    env = make_env([(hostile, "stop"), (ANSWER, "stop")])
    group = collect(env)
    assert "not allowed" in tokenizer.decode(group["tokens"][0])
    assert group["overrides"][0]["tool_errors"] == 1


def test_python_tool_runs_in_the_sandbox(make_env, tokenizer) -> None:
    call = '<think>\n<tool_call>\n{"name": "python_interpreter", "arguments": {"code": "x = 2 + 3\\nx"}}\n</tool_call>'
    env = make_env([(call, "stop"), (ANSWER, "stop")])
    group = collect(env)
    text = tokenizer.decode(group["tokens"][0])
    assert '"stdout": "5\\n"' in text and group["overrides"][0]["tool_calls"] == 1


def test_text_a_tool_prints_is_never_scored_as_the_models_answer(make_env, tokenizer) -> None:
    """A program that prints `</think>` and a box (JSON writes a backspace as `\\b`, so chr(8) +
    'oxed' reads as \\boxed in the response) does not close the model's thinking nor answer."""
    code = "print('<' + '/think>' + chr(8) + 'oxed{' + str(2 + 3) + '}')"
    call = '<think>\n<tool_call>\n' + json.dumps({"name": "python_interpreter", "arguments": {"code": code}}) + '\n</tool_call>'
    env = make_env([(call, "stop"), ("That is all.<|im_end|>", "stop")])
    group = collect(env)
    assert "</think>\\boxed{5}" in tokenizer.decode(group["tokens"][0])  # in the record, as inserted
    details = group["overrides"][0]
    assert details["reward_signals"]["correct"] == 0.0 and details["reward_signals"]["format_violation"] == 1.0
    assert details["finish"] == "eos"


def test_tool_call_limit_is_enforced(make_env, tokenizer) -> None:
    env = make_env([(CALL, "stop")] * 3 + [(ANSWER, "stop")], ["env.max_tool_calls=2"])
    group = collect(env)
    assert group["overrides"][0]["tool_calls"] == 2
    assert "tool call limit (2) reached" in tokenizer.decode(group["tokens"][0])


@pytest.mark.parametrize(
    ("reply", "score", "additive", "finish"),
    [
        ("<think>no tools</think> The answer is \\boxed{5}.<|im_end|>", 1.0, 1.0, "eos"),
        ("<think>no tools</think> The answer is \\boxed{4}.<|im_end|>", -1.0, -1.0, "eos"),
        ("<think>never closed \\boxed{5}<|im_end|>", -1.0, -3.0, "eos"),
        ("<think>x</think>" + '<tool_call>\n{"name": "calculator", "arguments": {"expr": "1"}}\n</tool_call>', -1.0, -3.0, "tool_after_think"),
    ],
)
def test_reward_signals(make_env, reply: str, score: float, additive: float, finish: str) -> None:
    """A format violation scores the reference's flat -1; reward.format_penalty=additive adds its weight instead."""
    env = make_env([(reply, "stop")])
    group = collect(env)
    assert group["scores"] == [pytest.approx(score)]
    assert group["overrides"][0]["finish"] == finish
    group = collect(make_env([(reply, "stop")], ["reward.format_penalty=additive"]))
    assert group["scores"] == [pytest.approx(additive)]


def test_token_budget_bounds_the_rollout(make_env) -> None:
    long_text = "<think>" + "word " * 400
    env = make_env([(long_text, "length")] * 10, ["env.max_new_tokens=100", "env.max_tokens_per_segment=60"])
    group = collect(env)
    details = group["overrides"][0]
    assert details["generated_tokens"] == 100 and details["finish"] == "max_new_tokens"


def test_successes_feed_the_dynamic_pool(make_env) -> None:
    env = make_env([(CALL, "stop"), (ANSWER, "stop"), (CALL, "stop"), (ANSWER, "stop")])
    collect(env)
    assert len(env.dynamic_pool) == 1 and env.dynamic_pool[0][0] == "What is 2 + 3?"
    before = len(env.client.prompts[0])
    collect(env)
    assert len(env.client.prompts[2]) > before  # the pool example is now in the prompt


RIGHT = ("<think>no tools</think> The answer is \\boxed{5}.<|im_end|>", "stop")
WRONG = ("<think>no tools</think> The answer is \\boxed{4}.<|im_end|>", "stop")


def test_equal_score_groups_are_dropped_where_atroposlib_drops_them(make_env) -> None:
    """env.drop_equal_scores=null: kept when the run writes data (atroposlib's `process` keeps them),
    dropped when groups go to an Atropos trainer (its `serve` drops them); true/false force it."""
    env = make_env([RIGHT, RIGHT], ["group_size=2"])
    assert env.drop_reason(collect(env)) is None
    for overrides in (["mode=serve"], ["trainer=atropos"], ["env.drop_equal_scores=true"]):
        env = make_env([RIGHT, RIGHT], ["group_size=2", *overrides])
        group = collect(env)
        assert group["scores"] == [1.0, 1.0] and env.drop_reason(group) == "equal scores", overrides
    env = make_env([RIGHT, WRONG], ["group_size=2", "env.drop_equal_scores=true"])
    assert env.drop_reason(collect(env)) is None
    env = make_env([RIGHT, RIGHT], ["group_size=2", "mode=serve", "env.drop_equal_scores=false"])
    assert env.drop_reason(collect(env)) is None


def test_setup_starts_math_verify_workers_ahead_and_close_stops_them(make_env) -> None:
    """The first groups' scoring does not wait for a worker to import math-verify: `setup`
    starts them beside the first requests; `close` stops them."""
    env = make_env([(ANSWER, "stop")], ["reward.verify_workers=2"])

    async def main() -> list:
        await env.setup()
        await env.ready()
        workers = list(env.verifier._workers)
        await env.close()
        return workers

    workers = asyncio.run(main())
    assert len(workers) == 2 and all(w.process.poll() is not None for w in workers)


def test_rollouts_are_scored_as_they_finish_not_after_the_whole_group(make_env, tokenizer) -> None:
    """A slow check of one rollout's answer overlaps its siblings' requests instead of
    following them."""
    import time

    env = make_env([(ANSWER, "stop")] * 2, ["group_size=2"])
    env.client.latency = 0.3
    env.server.free = [1]  # one slot: the second rollout's request runs while the first is checked
    checking: list[float] = []

    async def slow_check(predicted: str, reference: str) -> bool:
        checking.append(time.perf_counter())
        await asyncio.sleep(0.3)
        return True

    env.verifier.matches = slow_check
    requests_ended: list[float] = []
    generate = env.client.generate

    async def timed_generate(*args, **kwargs):
        try:
            return await generate(*args, **kwargs)
        finally:
            requests_ended.append(time.perf_counter())

    env.client.generate = timed_generate
    item = {"id": "t1", "problem": "What is 2 + 3?", "answer": "5.0"}  # 5 vs 5.0: not equal as text, not both integers

    async def main() -> None:
        await env.ready()  # the turn parser loaded
        await env.collect_trajectories(item)

    asyncio.run(main())
    # The first answer's check began while the second rollout's request was still running (an
    # order of events, whatever the machine's load); checks after the whole group began after it.
    assert len(checking) == 2 and len(requests_ended) == 2 and checking[0] < requests_ended[1]
