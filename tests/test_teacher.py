"""teacher=model: a separate teacher's rows on every sampled token (inline_math and opd_coding),
the record rule that refuses a group missing one, the tokenizer check at start-up, the config
group, and the trainer's OPD terms on such groups. Scripted servers here; a real run with two
vLLM servers and the closed loop is `test_a_teacher_model_run_writes_rows_on_every_trained_token_and_the_loop_trains_on_them`."""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import time
from pathlib import Path

import pytest

from conftest import compose
from opd.config import ConfigError, validate
from opd.data.sources import TaskSet
from opd.records import DISTILL_PAD_ID, DISTILL_PAD_LOGPROB, MASK, check_group
from opd.serving.vllm_client import Generation, PromptScores
from scripted import ScriptedClient, build_env, text_generator
from test_closed_loop import restores_the_fixture_weights  # noqa: F401  (a fixture)
from test_opd_coding_env import BAD, RUN, TASK, Script, call

MATH_CALL = '<think>\nI will compute 2 + 3.\n<tool_call>\n{"name": "calculator", "arguments": {"expr": "2 + 3"}}\n</tool_call>'
MATH_ANSWER = "The tool gives 5.\n</think>\n\nThe answer is \\boxed{5}.<|im_end|>"
MATH_ITEM = {"id": "t0", "problem": "What is 2 + 3?", "answer": "5"}
TEACHER = ["teacher=model", "teacher.server.model=fixture", "distill_topk=4"]


def teacher_rows(ids: list[int], k: int) -> PromptScores:
    """Deterministic teacher rows that depend on the scored token (so a misplaced row shows)."""
    rows = [[(t + j) % 4000 for j in range(k)] for t in ids]
    lps = [[-0.05 * (j + 1) - (t % 7) * 0.01 for j in range(k)] for t in ids]
    return PromptScores([[]] + rows[1:], [[]] + lps[1:], [None] + [-1.0 - (t % 5) * 0.1 for t in ids[1:]])


def math_env(fixture_model: str, tokenizer, overrides: list[str] | None = None, group_size: int = 2):
    policy = ScriptedClient(generate=text_generator(tokenizer, [(MATH_CALL, "stop"), (MATH_ANSWER, "stop")] * group_size))
    teacher = ScriptedClient(score=teacher_rows)
    cfg = validate(compose([f"group_size={group_size}", *TEACHER, *(overrides or [])]))
    env = build_env(cfg, TaskSet(train=[MATH_ITEM], eval=[], source="test"), fixture_model, policy, teacher=teacher)
    env.policy, env.teacher_client = policy, teacher
    return env


def assert_taught_everywhere(group: dict, teacher: ScriptedClient) -> None:
    """Every generated token carries the teacher's row of exactly that position of the scored
    sequence; every other position carries pads."""
    assert group["group_overrides"]["teacher"] == "model"
    assert sorted(map(tuple, teacher.scored)) == sorted(map(tuple, group["tokens"]))
    for i, tokens in enumerate(group["tokens"]):
        expected = teacher_rows(tokens, 4)
        for p, mask in enumerate(group["masks"][i]):
            ids, lps, sampled = group["distill_token_ids"][i][p], group["distill_logprobs"][i][p], group["overrides"][i]["teacher_logprobs"][p]
            if mask == MASK:
                assert ids == [DISTILL_PAD_ID] * 4 and lps == [DISTILL_PAD_LOGPROB] * 4 and sampled is None
            else:
                assert (ids, lps, sampled) == (expected.top_ids[p], expected.top_logprobs[p], expected.token_logprobs[p])


def test_inline_math_with_a_teacher_model_has_its_row_on_every_sampled_token(fixture_model, tokenizer) -> None:
    env = math_env(fixture_model, tokenizer)
    group, _ = asyncio.run(env.collect_trajectories(MATH_ITEM))
    assert check_group(group) == []
    assert_taught_everywhere(group, env.teacher_client)
    # The teacher scored on its own server, never the policy's; inserted tool responses got pads (checked above).
    assert env.policy.scored == [] and len(env.teacher_client.scored) == 2
    metrics = env.group_metrics(group)
    assert metrics["teacher/token_coverage"] == 1.0 and metrics["teacher/reverse_kl"] > 0


def test_a_teacher_model_group_missing_a_teacher_row_is_refused(fixture_model, tokenizer) -> None:
    env = math_env(fixture_model, tokenizer)
    group, _ = asyncio.run(env.collect_trajectories(MATH_ITEM))
    trained = [p for p, m in enumerate(group["masks"][1]) if m != MASK]
    row = json.loads(json.dumps(group))
    row["distill_token_ids"][1][trained[3]] = [DISTILL_PAD_ID] * 4
    row["distill_logprobs"][1][trained[3]] = [DISTILL_PAD_LOGPROB] * 4
    assert any(f"trained token [1][{trained[3]}] has no teacher row" in p for p in check_group(row))
    lp = json.loads(json.dumps(group))
    lp["overrides"][0]["teacher_logprobs"][trained[0]] = None
    assert any(f"trained token [0][{trained[0]}]" in p for p in check_group(lp))
    bare = json.loads(json.dumps(group))
    del bare["distill_token_ids"], bare["distill_logprobs"]
    assert any("has no distill rows" in p for p in check_group(bare))
    # The same gaps are allowed where no teacher model claims every token (the self-hint teacher's records).
    row["group_overrides"]["teacher"] = None
    assert check_group(row) == []


def test_a_teacher_that_fails_fails_the_group_rather_than_write_it_without_rows(fixture_model, tokenizer) -> None:
    from opd.serving.vllm_client import ServerRequestError

    env = math_env(fixture_model, tokenizer)

    def down(ids, k):
        raise ServerRequestError("teacher down", 503)

    env.teacher_client._score = down
    with pytest.raises(ServerRequestError, match="teacher down"):
        asyncio.run(env.collect_trajectories(MATH_ITEM))


def coding_env(fixture_model: str, tokenizer, turns: list[str], overrides: list[str]):
    script = Script(tokenizer, turns)
    policy = ScriptedClient(generate=script.generate, chat=script.chat, score=script.score)
    teacher = ScriptedClient(score=teacher_rows)
    cfg = validate(compose(["env=opd_coding", "group_size=1", "judge_votes=3", *TEACHER, *overrides]))
    env = build_env(cfg, TaskSet(train=[TASK], eval=[TASK], source="test"), fixture_model, policy, max_attempts=1, teacher=teacher)
    env.policy, env.teacher_client = policy, teacher
    return env


def test_opd_coding_with_a_teacher_model_scores_every_turn_on_the_students_exact_context(fixture_model, tokenizer) -> None:
    env = coding_env(fixture_model, tokenizer, [call("write_file", path="solution.py", content=BAD), RUN, "Done."], [])
    group, _ = asyncio.run(env.collect_trajectories(TASK))
    assert check_group(group) == []
    assert_taught_everywhere(group, env.teacher_client)
    assert env.policy.chats == [] and "opd_turns" not in group["overrides"][0]  # teacher.hint=false: no judge


def test_opd_coding_with_a_hinted_teacher_model_rescores_hinted_turns_with_the_hint(fixture_model, tokenizer) -> None:
    env = coding_env(fixture_model, tokenizer, [call("write_file", path="solution.py", content=BAD), RUN, "Done."], ["teacher.hint=true"])
    group, _ = asyncio.run(env.collect_trajectories(TASK))
    assert check_group(group) == []
    turns = group["overrides"][0]["opd_turns"]
    hinted = [t for t in turns if t["hint"]]
    assert hinted and all(t["scored"] for t in hinted)
    # One whole-rollout request, then one per hinted turn with the hint in its context; all to the teacher.
    assert len(env.teacher_client.scored) == 1 + len(hinted) and env.policy.scored == []
    hinted_prompt = env.teacher_client.scored[1]
    assert "[user's hint / instruction]" in tokenizer.decode(hinted_prompt)
    start, end = hinted[0]["span"]
    expected = teacher_rows(hinted_prompt, 4)
    cut = len(hinted_prompt) - (end - start)  # the hinted context, then the turn's exact ids
    assert hinted_prompt[cut:] == group["tokens"][0][start:end]
    assert group["distill_token_ids"][0][start:end] == expected.top_ids[cut:]
    # Every other trained token keeps the plain rows.
    rows = [p for p, m in enumerate(group["masks"][0]) if m != MASK and not start <= p < end]
    plain = teacher_rows(group["tokens"][0], 4)
    assert all(group["distill_token_ids"][0][p] == plain.top_ids[p] for p in rows)


def test_the_teacher_group_defaults_per_env_and_its_combinations_are_checked() -> None:
    assert validate(compose(["env=inline_math"])).teacher.kind == "none"
    coding = validate(compose(["env=opd_coding"]))
    assert coding.teacher.kind == "self_hint" and coding.env.opd.enabled
    assert not validate(compose(["env=opd_coding", "teacher=none"])).env.opd.enabled
    model = validate(compose(["env=inline_math", "teacher=model", "teacher.server.model=/some/dir", "distill_topk=7"]))
    assert (model.teacher.server.model, model.teacher.topk, model.teacher.server.base_url) == ("/some/dir", 7, None)
    for overrides, message in [
        (["env=inline_math", "teacher=self_hint"], "teacher must be none or model with this env"),
        (["env=inline_math", "teacher=model"], "teacher.server.model must be set"),
        (["env=inline_math", "teacher=model", "teacher.server.model=m", "teacher.hint=true"], "teacher.hint must be false with this env"),
        (["env=inline_math", "teacher=model", "teacher.server.model=m", "teacher.max_concurrent=0"], "teacher.max_concurrent must be >= 1"),
        (["env=inline_math", "teacher=model", "teacher.server.model=m", "teacher.server.base_url=localhost:8000"], "teacher.server.base_url must be an http(s) URL"),
        (["env=opd_coding", "teacher=none", "env.opd.enabled=true"], "env.opd.enabled: true judges turns for hints, but teacher=none"),
    ]:
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            validate(compose(overrides))
    # With a teacher model the OPD terms alone may train inline_math (without one, preflight refuses it).
    from opd.teachers import teacher_of

    teacher_of(validate(compose(["env=inline_math", "trainer=local", "trainer.loss.pg=0", *TEACHER]))).check_loss()
    with pytest.raises(ConfigError, match="trainer.loss: opd_advantage=1 needs teacher rows"):
        teacher_of(validate(compose(["env=inline_math", "trainer=local", "trainer.loss.pg=0"]))).check_loss()


def modified_tokenizer_copy(fixture_model: str, out: Path) -> Path:
    """The fixture model's files with one added token renamed: same vocabulary size, other specials."""
    shutil.copytree(fixture_model, out)
    data = json.loads((out / "tokenizer.json").read_text())
    for token in data["added_tokens"]:
        if token["content"] == "<think>":
            token["content"] = "<reason>"
    (out / "tokenizer.json").write_text(json.dumps(data))
    config = json.loads((out / "tokenizer_config.json").read_text())
    for entry in (config.get("added_tokens_decoder") or {}).values():
        if entry.get("content") == "<think>":
            entry["content"] = "<reason>"
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


def test_a_teacher_of_another_tokenizer_fails_at_start_up_naming_both_models(fixture_model, tmp_path) -> None:
    from opd.teachers import ModelTeacher

    other = modified_tokenizer_copy(fixture_model, tmp_path / "other_teacher")
    cfg = validate(compose(["env=inline_math", "teacher=model", f"teacher.server.model={other}"]))
    with pytest.raises(ConfigError) as caught:
        ModelTeacher(cfg).check(fixture_model)
    message = str(caught.value)
    assert "\n" not in message and str(other) in message and "server.model='fixture'" in message and caught.value.key == "teacher.server.model"
    # A copy with the very same files passes, and its directory is what the run serves.
    same = tmp_path / "same_teacher"
    shutil.copytree(fixture_model, same)
    cfg = validate(compose(["env=inline_math", "teacher=model", f"teacher.server.model={same}"]))
    assert ModelTeacher(cfg).check(fixture_model) == str(same)


def teacher_group(scores: list[float]) -> dict:
    """A hand-built teacher=model group: two rollouts, every generated token with a teacher row."""
    prompt, generated = [1, 2, 3], [10, 11, 12, 13]
    tokens = prompt + generated
    masks = [MASK] * 3 + generated
    student = [1.0] * 3 + [-1.0] * 4
    teacher = [None] * 3 + [-0.2, -0.3, -2.0, -0.1]
    rows = [[DISTILL_PAD_ID] * 2] * 3 + [[t, t + 1] for t in generated]
    lps = [[DISTILL_PAD_LOGPROB] * 2] * 3 + [[-0.2, -1.9]] * 4
    return {"tokens": [tokens, tokens], "masks": [masks, masks], "inference_logprobs": [student, student], "scores": scores,
            "overrides": [{"teacher_logprobs": teacher}, {"teacher_logprobs": teacher}], "distill_token_ids": [rows, rows],
            "distill_logprobs": [lps, lps], "group_overrides": {"teacher": "model"}}


def test_the_trainer_reads_a_teacher_row_on_every_trained_token_and_keeps_equal_score_groups_for_opd() -> None:
    import torch

    from opd.train.batch import make_batch
    from opd.train.losses import terms

    group = teacher_group([0.0, 0.0])
    assert check_group(group) == []
    batch = make_batch([group])
    assert torch.equal(batch.has_teacher, batch.trained) and torch.equal(batch.has_topk, batch.trained) and batch.trained.sum() == 8
    logits = torch.zeros(2, 7, 16, requires_grad=True)
    t = terms(logits, batch, clip=0.2, opd_clamp=5.0)
    assert float(t.losses["pg"].detach()) == 0.0  # equal scores: no GRPO signal
    assert float(t.losses["opd_advantage"].detach()) != 0.0 and float(t.opd_tokens) == 8 and float(t.topk_tokens) == 8
    # equal_score_groups=drop keeps a group with teacher rows: its OPD terms still train.
    from types import SimpleNamespace

    from opd.train.trainer import LocalTrainer

    opd = SimpleNamespace(cfg=SimpleNamespace(equal_score_groups="drop", loss={"pg": 1.0, "opd_advantage": 1.0, "topk_kl": 0.0}))
    assert LocalTrainer.trainable(opd, [group, {**group, "overrides": [{}, {}]}]) == ([group], 1)


@pytest.fixture
def stand_in_teacher(fixture_model: str, tmp_path: Path) -> str:
    """A stand-in teacher: the fixture's files (the very same tokenizer) with every weight nudged,
    so teacher != student on every token."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    out = tmp_path / "stand_in_teacher"
    shutil.copytree(fixture_model, out)
    model = AutoModelForCausalLM.from_pretrained(fixture_model, torch_dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for tensor in model.parameters():
            tensor.add_(torch.randn(tensor.shape, generator=generator) * 0.05 * (tensor.std() if tensor.numel() > 1 else 1.0))
    model.save_pretrained(out)
    return str(out)


@pytest.mark.vllm
@pytest.mark.slow
def test_a_teacher_model_run_writes_rows_on_every_trained_token_and_the_loop_trains_on_them(tmp_path, fixture_model, vllm_url, stand_in_teacher,
                                                                                            restores_the_fixture_weights) -> None:
    """env=inline_math teacher=model with the student on the session's vLLM and the stand-in
    teacher on the second vLLM the run starts itself; trainer=local trains on the records."""
    from helpers import assert_taught, launch, mlflow_run
    from opd.records import read_groups

    launch(tmp_path, fixture_model, vllm_url, [
        "env=inline_math", "teacher=model", f"teacher.server.model={stand_in_teacher}", "trainer=local", "trainer.batch_groups=2",
        "total_steps=2", "group_size=4", "runner.groups_in_flight=2", "trainer.equal_score_groups=drop",
    ])
    groups = list(read_groups(tmp_path / "run" / "groups.jsonl"))
    assert len(groups) == 2
    for group in groups:
        assert_taught(group)
        for i, masks in enumerate(group["masks"]):
            trained = [p for p, m in enumerate(masks) if m != MASK]
            # The stand-in teacher is not the student: its logprobs of the sampled tokens differ.
            assert any(abs(group["overrides"][i]["teacher_logprobs"][p] - group["inference_logprobs"][i][p]) > 1e-3 for p in trained)
    client, run = mlflow_run(tmp_path)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["teacher/token_coverage"] == 1.0
    (step,) = client.get_metric_history(run.info.run_id, "trainer/loss_opd_advantage")
    assert step.value != 0.0 and run.data.metrics["summary/trainer_steps"] == 1
    assert (tmp_path / "run" / "vllm_teacher" / "server.log").exists()  # the run served its teacher itself


@pytest.mark.vllm
@pytest.mark.slow
def test_the_teachers_own_server_is_restarted_when_it_dies_and_every_group_still_has_its_rows(tmp_path, fixture_model, vllm_url) -> None:
    """The student on the session's vLLM, the fixture's teacher on the vLLM the run starts; that
    server is killed (as an out-of-memory kill would) with groups still to write."""
    import os
    import signal

    from helpers import assert_taught, launch_process, lines, mlflow_run
    from opd.records import read_groups
    from procs import cmdline, descendants

    groups_path = tmp_path / "run" / "groups.jsonl"
    # One group at a time, so that groups still need the teacher when it is killed.
    proc = launch_process(tmp_path, fixture_model, vllm_url, ["env=inline_math", "teacher=model", "teacher.server.model=fixture_teacher",
                                                              "total_steps=6", "group_size=2", "runner.groups_in_flight=1"])
    try:
        deadline = time.monotonic() + 400
        while lines(groups_path) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "stderr.log").read_text()[-3000:]
            time.sleep(0.05)
        # The student's server is not the run's: the only vLLM API process under it is the teacher's.
        victims = [p for p in descendants(proc.pid) if "vllm.entrypoints.openai.api_server" in cmdline(p) and "guard.py" not in cmdline(p)]
        assert victims and all("teacher" in cmdline(p) for p in victims), [cmdline(p) for p in victims]
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        assert proc.wait(timeout=600) == 0, (tmp_path / "stderr.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    groups = list(read_groups(groups_path))
    assert len(groups) == 6
    for group in groups:
        assert_taught(group)
    _, run = mlflow_run(tmp_path)
    assert run.info.status == "FINISHED" and run.data.metrics["teacher/token_coverage"] == 1.0
    assert run.data.metrics["summary/teacher_server_restarts"] == 1 and run.data.metrics["summary/server_restarts"] == 0
    assert "the teacher's embedded vLLM server at" in (tmp_path / "run" / "launch.log").read_text()


def test_an_entry_point_without_the_teacher_refuses_teacher_model_rather_than_write_untaught_records(fixture_model, tokenizer) -> None:
    policy = ScriptedClient(generate=text_generator(tokenizer, [(MATH_ANSWER, "stop")]))
    cfg = validate(compose(["group_size=1", *TEACHER]))
    with pytest.raises(ConfigError, match="teacher=model runs through python -m experiments.launch"):
        build_env(cfg, TaskSet(train=[MATH_ITEM], eval=[], source="test"), fixture_model, policy)


def test_teacher_scoring_runs_in_its_own_slots_beside_generation(fixture_model, tokenizer) -> None:
    """One policy slot, four rollouts: if scoring took the policy's slots, at most one request would
    run at a time; in the teacher's own slots all four rollouts' scorings overlap."""
    policy = ScriptedClient(generate=text_generator(tokenizer, [(MATH_ANSWER, "stop")] * 4))
    teacher = ScriptedClient(score=teacher_rows, latency=0.3)
    cfg = validate(compose(["group_size=4", *TEACHER, "teacher.max_concurrent=4"]))
    env = build_env(cfg, TaskSet(train=[MATH_ITEM], eval=[], source="test"), fixture_model, policy, slots=1, teacher=teacher)
    group, _ = asyncio.run(env.collect_trajectories(MATH_ITEM))
    assert check_group(group) == [] and policy.most_running == 1
    assert teacher.most_running == 4 and teacher.served == 4


def test_an_evaluation_with_a_teacher_reports_the_reverse_kl_of_its_sampled_rollouts(fixture_model, tokenizer) -> None:
    """Each sampled held-out rollout is scored by the teacher: eval/sampled_reverse_kl_to_teacher is
    the mean over rollouts of their per-token student_lp - teacher_lp (the greedy one has none)."""
    policy = ScriptedClient(generate=text_generator(tokenizer, [(MATH_CALL, "stop"), (MATH_ANSWER, "stop")] * 3))
    teacher = ScriptedClient(score=teacher_rows)
    cfg = validate(compose(["group_size=1", *TEACHER]))
    env = build_env(cfg, TaskSet(train=[MATH_ITEM], eval=[MATH_ITEM], source="test"), fixture_model, policy, teacher=teacher)
    report = asyncio.run(env.evaluate(concurrency=1, samples_per_item=2, seed=0))
    asyncio.run(env.close())
    assert len(teacher.scored) == 2  # the two samples, not the greedy rollout
    # Every sampled token has the scripted logprob -0.25; the teacher's row of token t is -1.0 - (t % 5) / 10.
    sampled = [t for text in (MATH_CALL, MATH_ANSWER) for t in tokenizer.encode(text, add_special_tokens=False)]
    expected = statistics.fmean(-0.25 - (-1.0 - (t % 5) * 0.1) for t in sampled)
    assert report.metrics["eval/sampled_reverse_kl_to_teacher"] == pytest.approx(expected)
    assert "eval/reverse_kl_to_teacher" not in report.metrics
    # The item's row has its samples' mean, the per-item value summary/reverse_kl_change pairs.
    assert report.items[0]["sampled_reverse_kl_to_teacher"] == pytest.approx(expected)
