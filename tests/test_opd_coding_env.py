"""opd_coding with a scripted server: tokens across turns, the reward's own tests, OPD rows.

The scripted server answers generation from a queue of assistant turns, the judge by reading the
next state, and scoring with deterministic rows it records; the real-server behaviour is covered
in test_opd_vllm.py.
"""

from __future__ import annotations

import asyncio

import pytest

from conftest import compose
from opd.agent.tool_calls import tool_call_text
from opd.config import ConfigError, validate
from opd.data.sources import TaskSet
from opd.records import DISTILL_PAD_ID, DISTILL_PAD_LOGPROB, MASK, check_group
from opd.serving.vllm_client import Generation, PromptScores, ServerRequestError
from scripted import ScriptedClient, build_env

TASK = {
    "id": "t-add3",
    "task": "Write a Python function `add_3(x)` that returns `x` plus 3.",
    "test_code": "from solution import add_3\nassert add_3(1) == 4\nassert add_3(-3) == 0\nprint('All tests passed!')\n",
}
GOOD = "def add_3(x):\n    return x + 3\n"
BAD = "def add_3(x):\n    return x + 4\n"
HINT = "The assertion add_3(1) == 4 fails: return x + 3, not x + 4."


def call(name: str, **arguments: str) -> str:
    return tool_call_text(name, arguments)


RUN = call("terminal", command="python test_solution.py")


class Script:
    """The scripted server: assistant turns from a queue, a judge that reads the next state, and
    deterministic teacher rows; failures on demand."""

    def __init__(self, tokenizer, turns: list[str]) -> None:
        self.tokenizer, self.turns = tokenizer, list(turns)
        self.judge_fails = False
        self.scoring_error: Exception | None = None

    def generate(self, prompt_ids, *, max_tokens, stop=None) -> Generation:
        ids = self.tokenizer.encode(self.turns.pop(0) + "<|im_end|>", add_special_tokens=False)
        return Generation(ids, [-0.5] * len(ids), "stop")

    def chat(self, messages, n) -> list[str]:
        if self.judge_fails:
            raise ServerRequestError("judge down", 503)
        state = messages[-1]["content"]
        return [f"\\boxed{{1}}\n[HINT_START]{HINT}[HINT_END]" if "AssertionError" in state else "\\boxed{-1}"] * n

    def score(self, ids, k) -> PromptScores:
        if self.scoring_error is not None:
            raise self.scoring_error
        rows = [[(t + j) % 4000 for j in range(k)] for t in ids]
        lps = [[-0.1 * (j + 1) for j in range(k)] for _ in ids]
        return PromptScores([[]] + rows[1:], [[]] + lps[1:], [None] + [-0.1] * (len(ids) - 1))


@pytest.fixture
def make_env(fixture_model: str, tokenizer):
    def build(turns: list[str], overrides: list[str] | None = None):
        script = Script(tokenizer, turns)
        client = ScriptedClient(generate=script.generate, chat=script.chat, score=script.score)
        cfg = validate(compose(["env=opd_coding", "group_size=1", "distill_topk=4", "judge_votes=3", *(overrides or [])]))
        data = TaskSet(train=[TASK], eval=[TASK], source="test")
        env = build_env(cfg, data, fixture_model, client, max_attempts=1)
        env.script, env.client = script, client
        return env

    return build


def collect(env) -> dict:
    group, _ = asyncio.run(env.collect_trajectories(TASK))
    assert check_group(group) == []
    return group


def spans(group: dict) -> list[tuple[int, int]]:
    masks = group["masks"][0]
    out, start = [], None
    for i, m in enumerate(masks + [MASK]):
        if m != MASK and start is None:
            start = i
        elif m == MASK and start is not None:
            out.append((start, i))
            start = None
    return out


def test_turns_are_exact_sampled_ids_with_one_end_of_turn_each(make_env, tokenizer) -> None:
    env = make_env([call("write_file", path="solution.py", content=GOOD), RUN, "The tests pass."])
    group = collect(env)
    tokens = group["tokens"][0]
    eos = tokenizer.eos_token_id
    turns = spans(group)
    assert len(turns) == 3
    for (start, end), text in zip(turns, [call("write_file", path="solution.py", content=GOOD), RUN, "The tests pass."]):
        assert tokens[start:end] == tokenizer.encode(text + "<|im_end|>", add_special_tokens=False)
        assert group["inference_logprobs"][0][start:end] == [-0.5] * (end - start)
    # After each turn's own end-of-turn token the template continues with a newline, never a second one.
    for _, end in turns[:-1]:
        assert tokens[end] != eos and tokens[end - 1] == eos
    text = tokenizer.decode(tokens)
    assert "wrote 31 bytes to solution.py" in text and "All tests passed!" in text and "[exit code 0]" in text
    details = group["overrides"][0]
    assert details["tests"] == "pass" and details["turns"] == 3 and details["finish"] == "answer"
    assert group["group_overrides"]["env"] == "opd_coding" and details["passed"] is True and details["tool_calls"] == len(details["tools_used"]) > 0
    assert group["scores"] == [pytest.approx(1.0)]


def test_own_trivial_test_file_earns_no_correctness(make_env) -> None:
    trivial = "print('All tests passed!')\n"
    env = make_env([
        call("write_file", path="solution.py", content=BAD),
        call("write_file", path="test_solution.py", content=trivial),
        RUN,
        "All tests passed.",
    ])
    group = collect(env)
    details = group["overrides"][0]
    assert details["tests"] == "assertion" and details["reward_signals"]["correctness"] == 0.2
    assert group["scores"][0] < 0.7


def test_passed_is_the_rubrics_verdict_recorded_once_and_read_by_the_metrics(make_env) -> None:
    """A rollout passed when the rubric says so (correctness >= reward.pass_threshold), not when
    its tests say "pass": with a failed assertion credited 0.9 and the threshold 0.8 it passed. The
    record says so once (`passed`); the group's accuracy, train/pass_rate and the evaluation read it."""
    turns = [call("write_file", path="solution.py", content=BAD), RUN, "Done."]
    env = make_env(turns, ["reward.correctness_levels.assertion=0.9", "env.opd.enabled=false"])
    group = collect(env)
    details = group["overrides"][0]
    assert details["tests"] == "assertion" and details["reward_signals"]["correctness"] == 0.9 and details["passed"] is True
    metrics = env.group_metrics(group)
    assert metrics["accuracy"] == metrics["train/pass_rate"] == 1.0
    env.script.turns = list(turns)
    assert asyncio.run(env.eval_item(TASK, 0.0)).correct is True


@pytest.mark.slow
def test_solution_that_exits_early_does_not_pass(make_env) -> None:
    env = make_env([call("write_file", path="solution.py", content="import os\nos._exit(0)\n"), "Done."])
    group = collect(env)
    assert group["overrides"][0]["tests"] == "crash" and group["overrides"][0]["passed"] is False


def test_no_solution_written(make_env) -> None:
    env = make_env(["I cannot do this."])
    group = collect(env)
    details = group["overrides"][0]
    assert details["tests"] == "nothing_written" and details["tools_used"] == [] and details["reward_signals"]["tool_usage"] == 0.0


def test_malformed_and_escaping_tool_calls_get_error_results(make_env, tokenizer) -> None:
    env = make_env([
        "<tool_call>\n{not json}\n</tool_call>",
        call("read_file", path="/etc/passwd"),
        call("write_file", path="../escape.py", content="x"),
        call("launch_missiles"),
        "Giving up.",
    ])
    group = collect(env)
    text = tokenizer.decode(group["tokens"][0])
    assert "not valid JSON" in text and "absolute paths are not allowed" in text and "'..' is not allowed" in text and "unknown tool" in text
    assert group["overrides"][0]["tool_errors"] == 4


def test_hinted_turn_carries_teacher_rows_on_its_own_tokens(make_env, tokenizer) -> None:
    env = make_env([call("write_file", path="solution.py", content=BAD), RUN, call("write_file", path="solution.py", content=GOOD), RUN, "Fixed."])
    group = collect(env)
    turns = spans(group)
    records = group["overrides"][0]["opd_turns"]
    assert [r["span"] for r in records] == [list(t) for t in turns[:4]]  # the final answer has no next state
    assert [r["decision"] for r in records] == [-1, 1, -1, -1] and records[1]["votes"] == [1, 1, 1]
    assert records[1]["hint"] == HINT and records[1]["scored"] and not records[0]["scored"]
    # One judge request per pair, all votes in it.
    assert len(env.client.chats) == 4 and all(r["n"] == 3 for r in env.client.chats)
    # The teacher saw the hinted context followed by exactly the student's ids of that turn.
    (scored,) = env.client.scored[-1:]
    start, end = turns[1]
    student = group["tokens"][0][start:end]
    assert scored[-len(student):] == student
    assert HINT in tokenizer.decode(scored[: -len(student)])
    ids, lps = group["distill_token_ids"][0], group["distill_logprobs"][0]
    offset = len(scored) - len(student)
    for position in range(len(ids)):
        if start <= position < end:
            assert ids[position] == [(scored[offset + position - start] + j) % 4000 for j in range(4)]
            assert group["overrides"][0]["teacher_logprobs"][position] == -0.1
        else:
            assert ids[position] == [DISTILL_PAD_ID] * 4 and lps[position] == [DISTILL_PAD_LOGPROB] * 4
            assert group["overrides"][0]["teacher_logprobs"][position] is None
    metrics = env.group_metrics(group)
    assert metrics["opd/pair_hint_rate"] == 0.25 and metrics["opd/turns_scored"] == 1 and metrics["opd/pairs"] == 4
    # The reference's names: rollouts with a hint (the group has one rollout), scored turns per rollout.
    assert metrics["opd/hint_rate"] == 1.0 and metrics["opd/mean_turns_scored"] == 1.0
    assert metrics["train/pass_rate"] == float(group["overrides"][0]["reward_signals"]["correctness"] >= 0.8)
    assert metrics["opd/teacher_minus_student_lp"] == pytest.approx(-0.1 + 0.5)


@pytest.mark.slow
def test_judge_and_scoring_failures_are_counted_and_the_group_stays_valid(make_env, caplog) -> None:
    env = make_env([call("write_file", path="solution.py", content=BAD), RUN, "Done."])
    env.script.judge_fails = True
    group = collect(env)
    records = group["overrides"][0]["opd_turns"]
    assert all(r["error"] and "judge down" in r["error"] for r in records)
    assert env.group_metrics(group)["opd/judge_failures"] == 2
    assert all(row == [DISTILL_PAD_ID] * 4 for row in group["distill_token_ids"][0])
    assert sum("OPD judge failed" in r.message for r in caplog.records) == 1  # logged once, counted always

    env = make_env([call("write_file", path="solution.py", content=BAD), RUN, "Done."])
    env.script.scoring_error = ServerRequestError("HTTP 500", 500)
    group = collect(env)
    assert group["overrides"][0]["opd_turns"][1]["hint"] == HINT and "HTTP 500" in group["overrides"][0]["opd_turns"][1]["error"]
    assert env.group_metrics(group)["opd/scoring_failures"] == 1


def test_k_above_the_server_limit_fails_before_generation(make_env) -> None:
    env = make_env([])
    env.script.scoring_error = ServerRequestError("Requested prompt logprobs of 4, which is greater than max allowed: 2", 400)
    with pytest.raises(ConfigError, match="distill_topk=4 is refused"):
        asyncio.run(env.setup())


@pytest.mark.slow
def test_opd_disabled_writes_plain_records(make_env) -> None:
    env = make_env([call("write_file", path="solution.py", content=BAD), RUN, "Done."], ["env.opd.enabled=false"])
    group = collect(env)
    assert "distill_token_ids" not in group and env.client.chats == []


@pytest.mark.slow
def test_reference_defaults_clamp_show_tests_and_any_positive_vote(make_env) -> None:
    """The reference's choices, each one override away from ours: the score clamped to [0, 1],
    the task's tests in the prompt, a hint when any vote is positive."""
    turns = [call("write_file", path="solution.py", content=GOOD), "Done."]
    heavy = ["env.opd.enabled=false", "reward.weights.correctness=2.0"]
    assert collect(make_env(turns, heavy))["scores"] == [1.0]
    assert collect(make_env(turns, [*heavy, "reward.clamp=null"]))["scores"][0] > 1.0
    shown = collect(make_env(turns, ["env.opd.enabled=false", "env.show_tests=true"]))["messages"][0][1]["content"]
    hidden = collect(make_env(turns, ["env.opd.enabled=false"]))["messages"][0][1]["content"]
    assert TASK["test_code"].strip() in shown and "assert add_3" not in hidden
    assert validate(compose(["env=opd_coding"])).judge.decision_rule == "any"
    assert validate(compose(["env=opd_coding", "model=qwen3"])).env.show_tests is True


@pytest.mark.slow
def test_a_failed_vote_request_is_retried_one_vote_at_a_time(make_env) -> None:
    """The n-vote request fails: each vote is asked alone; the one that fails again counts as
    unparseable and the others still decide (as the reference, which asks one vote per request)."""
    env = make_env([call("write_file", path="solution.py", content=BAD), RUN, "Done."], ["judge.decision_rule=majority"])
    asked = []

    def chat(messages, n):
        asked.append(n)
        if n > 1 or asked.count(1) == 1:  # every n-vote request, and the first single vote
            raise ServerRequestError("vote failed", 503)
        return env.script.chat(messages, n)

    env.client._chat = chat
    group = collect(env)
    records = group["overrides"][0]["opd_turns"]
    assert sorted(asked) == [1] * 6 + [3, 3]  # two pairs: one 3-vote request each, then 3 single votes each
    assert [len(r["votes"]) for r in records] == [3, 3] and sum(v is None for r in records for v in r["votes"]) == 1
    assert all(r["error"] is None for r in records) and any(r["hint"] for r in records)
    assert [r["votes_failed"] for r in records] in ([1, 0], [0, 1])
    metrics = env.env_metrics(group)
    assert metrics["opd/votes_failed"] == 1.0 and metrics["opd/votes_unparseable"] == 1.0 and metrics["opd/judge_failures"] == 0.0
    # Without the retry the pair's judging fails, as before.
    env = make_env([call("write_file", path="solution.py", content=BAD), RUN, "Done."], ["judge.retry_votes_alone=false"])
    asked.clear()
    env.client._chat = chat
    records = collect(env)["overrides"][0]["opd_turns"]
    assert all("vote failed" in r["error"] and r["votes_failed"] == 3 for r in records)
    assert asked == [3, 3]


@pytest.mark.slow
def test_votes_sent_alone_fail_alone_and_all_failing_fails_the_judging(make_env) -> None:
    """votes_in_one_request=false (the reference): one failed vote is an unparseable vote; when
    every vote of a pair fails, that pair's judging fails and is counted."""
    env = make_env([call("write_file", path="solution.py", content=BAD), RUN, "Done."],
                   ["judge.votes_in_one_request=false", "judge.decision_rule=majority"])
    asked = []

    def chat(messages, n):
        asked.append(n)
        if len(asked) <= 3:  # the first pair's three votes all fail
            raise ServerRequestError("vote failed", 503)
        if len(asked) == 4:  # one vote of the second pair fails
            raise ServerRequestError("vote failed", 503)
        return env.script.chat(messages, n)

    env.client._chat = chat
    group = collect(env)
    records = group["overrides"][0]["opd_turns"]
    assert asked == [1] * 6
    failed = [r for r in records if r["error"]]
    assert len(failed) == 1 and failed[0]["votes"] == [] and failed[0]["votes_failed"] == 3
    other = next(r for r in records if not r["error"])
    assert other["votes_failed"] == 1 and sum(v is None for v in other["votes"]) == 1
    metrics = env.env_metrics(group)
    assert metrics["opd/judge_failures"] == 1.0 and metrics["opd/votes_failed"] == 4.0
