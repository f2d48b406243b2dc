"""Each model preset's format, end to end through both environments, with the family's real
tokenizer and official chat template (opd.fixture.families; no hub) against a scripted server
answering in the family's real format: a tool call, a malformed call, a call after the answer,
reasoning blocks and Harmony channels, multi-turn exact tokens, the judge and teacher scoring on
the exact sampled ids, and the start-up check. Calls are read by vLLM's own parsers (the preset's
--tool-call-parser / --reasoning-parser)."""

from __future__ import annotations

import asyncio
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import compose, family_tokenizer, one_fast
from family_tokenizers import R1_STOCK
from opd.fixture.families import tokenizer_dir
from opd.serving.tokenizer import load_tokenizer
from opd.agent.chat_format import ChatFormat, ChatFormatError, TurnParser, check
from opd.agent.chat_tokens import holds_added_token
from opd.agent.tool_calls import ToolCall, ToolCallError
from opd.config import ConfigError, validate
from opd.data.sources import TaskSet
from opd.envs import coding_prompt
from opd.records import MASK, check_group
from scripted import ScriptedClient, build_env, vllm_like

# Every real-model preset (qwen2_5_coder: Qwen2.5's tokenizer and template under its own preset).
FAMILY_NAMES = ["deepseek_r1_distill", "gpt_oss", "llama3", "mistral", "qwen2_5", "qwen2_5_coder", "qwen3"]
TASK = {"id": "t-add3", "task": "Write add_3(x) returning x + 3.", "test_code": "from solution import add_3\nassert add_3(1) == 4\n"}
MATH = {"id": "m0", "problem": "What is 2 + 3?", "answer": "5"}


@pytest.fixture(scope="module")
def families() -> dict[str, tuple[Path, object, ChatFormat]]:
    """Per family: its real tokenizer's directory (tokenizer and official chat template from the
    package registries, opd.fixture.families), the tokenizer, and its preset's format."""
    out = {}
    for name in FAMILY_NAMES:
        directory = tokenizer_dir(name)
        out[name] = (directory, family_tokenizer(name), ChatFormat.from_config(validate(compose([f"model={name}"])).model))
    return out


def env_for(families, family: str, env: str, replies: list[str], overrides: list[str] | None = None):
    directory, tokenizer, _ = families[family]
    client = ScriptedClient(generate=vllm_like(tokenizer, replies))
    cfg = validate(compose([f"model={family}", f"env={env}", "group_size=1", f"server.model={directory}",
                            *(["env.opd.enabled=false"] if env == "opd_coding" else ["env.few_shots=0"]), *(overrides or [])]))
    data = TaskSet(train=[TASK if env == "opd_coding" else MATH], eval=[], source="test")
    return build_env(cfg, data, str(directory), client, max_attempts=1)


def collect(env, item) -> dict:
    group, _ = asyncio.run(env.collect_trajectories(item))
    assert check_group(group) == []
    return group


# ---- the start-up check --------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_each_family_passes_the_start_up_check(families, family: str) -> None:
    _, tokenizer, fmt = families[family]
    check(fmt, tokenizer, coding_prompt.TOOLS, family)


def test_the_check_names_model_template_and_what_is_missing(families, tmp_path: Path) -> None:
    directory, qwen, _ = families["qwen2_5"]
    llama_fmt = families["llama3"][2]
    with pytest.raises(ChatFormatError, match=r"model 'my-qwen'.*llama3_json format needs the tokens \['<\|eot_id\|>', '<\|start_header_id\|>', '<\|end_header_id\|>'\]"):
        check(llama_fmt, qwen, coding_prompt.TOOLS, "my-qwen")
    # The R1 distills' official template ignores `tools` (it is on the hub only: a stand-in of its
    # shape over the real tokenizer); the preset's own template (model.chat_template) renders them.
    stock_dir = tmp_path / "r1"
    shutil.copytree(families["deepseek_r1_distill"][0], stock_dir)
    (stock_dir / "chat_template.jinja").write_text(R1_STOCK)
    stock = load_tokenizer(str(stock_dir))
    r1_fmt = replace(families["deepseek_r1_distill"][2], chat_template=None)
    with pytest.raises(ChatFormatError, match=r"model 'r1'.*chat template of .*r1 does not render the tools \['write_file', 'read_file', 'terminal', 'patch'\]"):
        check(r1_fmt, stock, coding_prompt.TOOLS, "r1")
    # model.chat_template replaces the stock template, here and in vLLM (--chat-template).
    cfg = validate(compose(["model=deepseek_r1_distill"]))
    check(ChatFormat.from_config(cfg.model), stock, coding_prompt.TOOLS, "r1")
    assert cfg.server.chat_template == "conf/model/templates/deepseek_r1_distill.jinja"
    with pytest.raises(ChatFormatError, match="unknown_parser"):
        TurnParser(ChatFormat(tool_parser="unknown_parser"), qwen, coding_prompt.TOOLS)
    # The stock R1 template stops the environment before any generation.
    with pytest.raises(ChatFormatError, match="does not render the tools"):
        client = ScriptedClient(generate=vllm_like(stock, []))
        cfg = validate(compose(["model=deepseek_r1_distill", "model.chat_template=null", "env=opd_coding", f"server.model={tmp_path / 'r1'}"]))
        build_env(cfg, TaskSet(train=[TASK], eval=[], source="test"), str(tmp_path / "r1"), client)
    assert client.prompts == []


# ---- parsing one turn ----------------------------------------------------------------------

CALLS = {
    "qwen3": ('<tool_call>\n{"name": "terminal", "arguments": {"command": "ls"}}\n</tool_call>', "<tool_call>\n{'name': 'terminal'}\n</tool_call>"),
    "qwen2_5": ('<tool_call>\n{"name": "terminal", "arguments": {"command": "ls"}}\n</tool_call>', "<tool_call>\n{'name': 'terminal'}\n</tool_call>"),
    "qwen2_5_coder": ('<tool_call>\n{"name": "terminal", "arguments": {"command": "ls"}}\n</tool_call>', "<tool_call>\n{'name': 'terminal'}\n</tool_call>"),
    # R1's text starts inside <think> (the template opens it): a call comes after </think>.
    "deepseek_r1_distill": ('Ok.\n</think>\n\n<tool_call>\n{"name": "terminal", "arguments": {"command": "ls"}}\n</tool_call>',
                            "Ok.\n</think>\n\n<tool_call>\n{'name': 'terminal'}\n</tool_call>"),
    "llama3": ('{"name": "terminal", "parameters": {"command": "ls"}}<|eot_id|>', '{"name": "terminal", "parameters": {"command": "ls"}<|eot_id|>'),
    "mistral": ('[TOOL_CALLS] [{"name": "terminal", "arguments": {"command": "ls"}}]', '[TOOL_CALLS] [{"name": "terminal", "arguments": {"command": }]'),
    # Harmony: a call on the commentary channel, addressed to the function, ended by <|call|>.
    "gpt_oss": ('<|channel|>analysis<|message|>List first.<|end|><|start|>assistant<|channel|>commentary to=functions.terminal <|constrain|>json<|message|>{"command": "ls"}<|call|>',
                '<|channel|>commentary to=functions.terminal <|constrain|>json<|message|>{"command": }<|call|>'),
}


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_a_call_and_a_malformed_call_in_each_format(families, family: str) -> None:
    _, tokenizer, fmt = families[family]
    parser = TurnParser(fmt, tokenizer, coding_prompt.TOOLS)
    good, bad = CALLS[family]

    def ids(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    assert parser.parse(good, ids(good)).calls == [ToolCall("terminal", {"command": "ls"})]
    # The call the preset shows the model (prompts, few-shots) is one its parser reads.
    thought = "Ok.\n</think>\n\n" if family == "deepseek_r1_distill" else ""
    shown = thought + fmt.call_text("terminal", {"command": "ls"})
    assert parser.parse(shown, ids(shown)).calls == [ToolCall("terminal", {"command": "ls"})]
    (error,) = parser.parse(bad, ids(bad)).calls
    assert isinstance(error, ToolCallError)
    assert parser.parse("The answer is 42.").calls == []


def test_one_malformed_call_does_not_hide_the_others(families) -> None:
    _, tokenizer, fmt = families["qwen2_5"]
    parser = TurnParser(fmt, tokenizer, coding_prompt.TOOLS)
    calls = parser.parse('<tool_call>{"name": "read_file", "arguments": {"path": "a"}}</tool_call>\n<tool_call>{bad</tool_call>').calls
    assert calls[0] == ToolCall("read_file", {"path": "a"}) and isinstance(calls[1], ToolCallError) and "not valid JSON" in str(calls[1])


def test_reasoning_blocks_are_split_by_the_reasoning_parser(families) -> None:
    _, qwen, qwen_fmt = families["qwen3"]
    turn = qwen_fmt.call_text("terminal", {"command": "ls"})
    parsed = TurnParser(qwen_fmt, qwen, coding_prompt.TOOLS).parse(f"<think>\nI should list files.\n</think>\n\n{turn}")
    assert parsed.reasoning.strip() == "I should list files." and parsed.calls == [ToolCall("terminal", {"command": "ls"})]
    # R1: the template opens <think>; the model's text starts inside it. A call written while
    # thinking is reasoning, not a call (as vLLM serves it); after </think> it is a call.
    _, r1, r1_fmt = families["deepseek_r1_distill"]
    parser = TurnParser(r1_fmt, r1, coding_prompt.TOOLS)
    inside = parser.parse(f"Maybe {turn} later.\n</think>\n\nDone.")
    assert inside.calls == [] and "Maybe" in inside.reasoning and inside.content.strip() == "Done."
    after = parser.parse(f"List first.\n</think>\n\n{turn}")
    assert after.reasoning.strip() == "List first." and after.calls == [ToolCall("terminal", {"command": "ls"})]


# ---- the agent (opd_coding) in each format: multi-turn exact tokens -----------------------


def _write(fmt: ChatFormat, family: str, content: str) -> str:
    text = fmt.call_text("write_file", {"path": "solution.py", "content": content})
    return text.removesuffix("</s>").removesuffix("<|eot_id|>")  # an end-of-turn token: the server adds it


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_agent_turns_keep_exact_tokens_in_each_format(families, family: str) -> None:
    directory, tokenizer, fmt = families[family]
    think = {"qwen3": "<think>\nPlan.\n</think>\n\n", "deepseek_r1_distill": "Plan.\n</think>\n\n",
             "gpt_oss": "<|channel|>analysis<|message|>Plan.<|end|><|start|>assistant"}.get(family, "")
    bad = CALLS[family][1].removeprefix("Ok.\n</think>\n\n")
    answer = "<|channel|>final<|message|>Done: add_3 is written.<|return|>" if family == "gpt_oss" else "Done: add_3 is written."
    replies = [think + _write(fmt, family, "def add_3(x):\n    return x + 3\n"), think + bad, think + answer]
    env = env_for(families, family, "opd_coding", replies)
    group = collect(env, TASK)
    details, tokens, masks = group["overrides"][0], group["tokens"][0], group["masks"][0]
    assert details["turns"] == 3 and details["tests"] == "pass" and details["tool_errors"] == 1 and details["tools_used"] == ["write_file"]
    assert details["finish"] == "answer"
    # The trained spans are exactly the ids the server returned, in order; everything else is masked.
    sampled = [list(ids) for ids in _sampled_spans(tokens, masks)]
    expected = [tokenizer.encode(r, add_special_tokens=False) for r in replies]
    assert [s[: len(e)] for s, e in zip(sampled, expected)] == expected and len(sampled) == 3
    # Each request's prompt is the record so far (what the server saw is what is recorded), and
    # its sampled ids follow it directly.
    prompts = env.server.clients[0].prompts
    assert len(prompts) == 3
    for prompt, ids in zip(prompts, expected):
        assert tokens[: len(prompt)] == prompt and tokens[len(prompt) : len(prompt) + len(ids)] == ids
    messages = group["messages"][0]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert "error" in messages[5]["content"] and "solution.py" in messages[3]["content"]
    decoded = tokenizer.decode(tokens, skip_special_tokens=False)
    rendered = fmt.render(tokenizer, messages, coding_prompt.TOOLS)
    if family == "mistral":
        # Mistral's template renders each call with the 9-character id the run gave it (and its
        # result names that id); the record keeps the call as sampled, without it.
        ids = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
        assert len(ids) == 2 and all(len(i) == 9 and i.isalnum() for i in ids)
        assert [c["id"] for m in messages if m.get("tool_calls") for c in m["tool_calls"]] == ids
        for call_id in ids:
            rendered = rendered.replace(f', "id": "{call_id}"', "")
        # A malformed call is rendered as a call to `invalid_tool_call` (its result is the error).
        rendered = rendered.replace('[TOOL_CALLS] [{"name": "invalid_tool_call", "arguments": {}}]', bad)
    if family == "gpt_oss":
        # Harmony's template renders a call with the recipient in the header and drops the analysis
        # of turns a final message follows: the record keeps the ids as sampled (a trainer needs
        # them), and the messages carry the channels as the template's fields.
        assert not rendered.startswith(decoded)
        assert messages[2]["thinking"] == "Plan." and messages[2]["tool_calls"][0]["function"]["name"] == "write_file"
        assert messages[6]["content"] == "Done: add_3 is written." and messages[6]["sampled"].startswith("<|channel|>analysis<|message|>Plan.")
        return
    # The record decodes to the template's rendering of the whole conversation: nothing re-tokenised.
    assert rendered.startswith(decoded)


def _sampled_spans(tokens: list[int], masks: list[int]):
    span: list[int] = []
    for token, mask in zip(tokens, masks):
        if mask != MASK:
            span.append(token)
        elif span:
            yield span
            span = []
    if span:
        yield span


# ---- inline_math in each format: a call, a malformed call, a call after the answer ---------


INLINE = {
    "qwen3": ('<think>\nI will compute 2 + 3.\n<tool_call>\n{"name": "calculator", "arguments": {"expr": "2 + 3"}}\n</tool_call>',
              "<think>\n<tool_call>\n{'name': 'calculator'}\n</tool_call>"),
    "qwen2_5": ('<think>\nI will compute 2 + 3.\n<tool_call>\n{"name": "calculator", "arguments": {"expr": "2 + 3"}}\n</tool_call>',
                "<think>\n<tool_call>\n{'name': 'calculator'}\n</tool_call>"),
    "qwen2_5_coder": ('<think>\nI will compute 2 + 3.\n<tool_call>\n{"name": "calculator", "arguments": {"expr": "2 + 3"}}\n</tool_call>',
                      "<think>\n<tool_call>\n{'name': 'calculator'}\n</tool_call>"),
    "deepseek_r1_distill": ('I will compute 2 + 3.\n<tool_call>\n{"name": "calculator", "arguments": {"expr": "2 + 3"}}\n</tool_call>',
                            "<tool_call>\n{'name': 'calculator'}\n</tool_call>"),
    "llama3": ('<think>\nI will compute 2 + 3.\n{"name": "calculator", "parameters": {"expr": "2 + 3"}}<|eot_id|>',
               '<think>\n{"name": "calculator", "parameters": {"expr": }<|eot_id|>'),
    "mistral": ('<think>\nI will compute 2 + 3.\n[TOOL_CALLS] [{"name": "calculator", "arguments": {"expr": "2 + 3"}}]</s>',
                '<think>\n[TOOL_CALLS] [{"name": "calculator", "arguments": {"expr": }]</s>'),
    "gpt_oss": ('<|channel|>analysis<|message|>I will compute 2 + 3.<|end|><|start|>assistant<|channel|>commentary to=functions.calculator <|constrain|>json<|message|>{"expr": "2 + 3"}<|call|>',
                '<|channel|>commentary to=functions.calculator <|constrain|>json<|message|>{"expr": }<|call|>'),
}
HARMONY_ANSWER = "<|channel|>analysis<|message|>The tool gives 5.<|end|><|start|>assistant<|channel|>final<|message|>The answer is \\boxed{5}.<|return|>"
ANSWER = "The tool gives 5.\n</think>\n\nThe answer is \\boxed{5}."


@pytest.mark.parametrize("family", one_fast(FAMILY_NAMES, ("qwen3",)))
def test_inline_math_runs_calls_in_each_format(families, family: str) -> None:
    _, tokenizer, fmt = families[family]
    call, bad = INLINE[family]
    answer = HARMONY_ANSWER if family == "gpt_oss" else ANSWER
    env = env_for(families, family, "inline_math", [call, answer])
    group = collect(env, MATH)
    details = group["overrides"][0]
    assert (details["tool_calls"], details["tool_errors"], details["passed"], details["finish"]) == (1, 0, True, "eos")
    assert details["reward_signals"]["format_violation"] == 0.0
    # The response the env inserted is the family's text, naming the called function (and the
    # call's id, for Mistral), masked; the call's ids were sampled.
    text = tokenizer.decode(group["tokens"][0], skip_special_tokens=False)
    call_id = next((m["tool_call_id"] for m in group["messages"][0] if m.get("tool_call_id")), "")
    response = fmt.response_text({"value": 5}, "calculator", call_id)
    assert response in text
    inserted = [t for t, m in zip(group["tokens"][0], group["masks"][0]) if m == MASK]
    assert response in tokenizer.decode(inserted, skip_special_tokens=False)
    # The marker ends the sampled segment however it is tokenised (bytes for R1, one token elsewhere).
    assert text.count(fmt.call_end) >= 1
    # A malformed call: an error result, and the rollout goes on to its answer.
    env = env_for(families, family, "inline_math", [bad, answer])
    details = collect(env, MATH)["overrides"][0]
    assert (details["tool_calls"], details["tool_errors"], details["passed"]) == (0, 1, True)
    # A call after the answer's </think>: the rollout ends there, a format violation.
    after = call.replace("<think>\n", "").replace("I will compute 2 + 3.\n", "Done.\n</think>\n\n\\boxed{5} ")
    if family == "deepseek_r1_distill":
        after = "Done.\n</think>\n\n\\boxed{5} " + call.split("\n", 1)[1]
    if family == "gpt_oss":
        after = "<|channel|>final<|message|>\\boxed{5}<|end|><|start|>assistant" + call.split("<|start|>assistant", 1)[1]
    env = env_for(families, family, "inline_math", [after])
    details = collect(env, MATH)["overrides"][0]
    assert details["finish"] == "tool_after_think" and details["reward_signals"]["format_violation"] == 1.0


def test_every_preset_names_parsers_vllm_knows() -> None:
    from vllm.parser.parser_manager import ParserManager

    for path in sorted((Path(__file__).resolve().parent.parent / "conf" / "model").glob("*.yaml")):
        model = validate(compose([f"model={path.stem}"])).model
        fmt = ChatFormat.from_config(model)
        assert ParserManager.get_parser(tool_parser_name=fmt.tool_parser, reasoning_parser_name=fmt.reasoning_parser,
                                        enable_auto_tools=True, is_harmony=fmt.harmony) is not None, path.stem


def test_an_unknown_parser_name_ends_the_run_before_any_group_is_written(tmp_path: Path) -> None:
    """The parsers load while the first requests go out; a bad name is a configuration error that
    ends the run at once (not a failed group retried), and nothing is written."""
    from opd.runner import Runner, RunnerLimits
    from opd.sinks.jsonl import GroupFile

    directory = tokenizer_dir("qwen2_5")
    tokenizer = family_tokenizer("qwen2_5")
    cfg = validate(compose(["model=qwen2_5", "model.tool_call_parser=no_such_parser", "env=inline_math", "group_size=2", f"server.model={directory}"]))
    client = ScriptedClient(generate=vllm_like(tokenizer, ["<think>I add.</think> \\boxed{5}"] * 8))
    env = build_env(cfg, TaskSet(train=[MATH], eval=[], source="test"), str(directory), client)
    out = tmp_path / "groups.jsonl"

    async def run() -> None:
        file = GroupFile(out)
        await file.open()
        try:
            await Runner(env, [file], 3, RunnerLimits(2, 3, 10, 10), progress=False).run()
        finally:
            await file.close("FAILED")
            await env.close()

    with pytest.raises(ChatFormatError, match="no_such_parser") as raised:
        asyncio.run(run())
    assert isinstance(raised.value, ConfigError) and raised.value.key == "model"
    assert client.prompts, "the first requests went out before the parser was loaded"
    assert out.read_text() == ""


def test_a_turn_with_more_calls_than_the_cap_runs_only_the_first_ones(families) -> None:
    """vLLM's parser reads every well-formed call of a turn; past MAX_CALLS_PER_TURN the rest are
    one error result, on the whole-turn path as on the one-by-one fallback."""
    from opd.agent.chat_format import MAX_CALLS_PER_TURN

    _, tokenizer, fmt = families["qwen2_5"]
    parser = TurnParser(fmt, tokenizer, coding_prompt.TOOLS)
    one = fmt.call_text("terminal", {"command": "echo hi"}) + "\n"
    for calls in (parser.parse(one * 40).calls, parser.calls(one * 40)):
        assert len(calls) == MAX_CALLS_PER_TURN + 1
        assert all(isinstance(c, ToolCall) for c in calls[:MAX_CALLS_PER_TURN])
        assert isinstance(calls[-1], ToolCallError) and "40 tool calls in one turn" in str(calls[-1])
    assert len(parser.parse(one * MAX_CALLS_PER_TURN).calls) == MAX_CALLS_PER_TURN


# ---- OPD in each format: the judge, and the teacher scoring the exact sampled ids -----------

HINT = "Run the tests after writing the file."


def _prompt_rows(ids: list[int], k: int):
    """Prompt-logprob rows as vLLM returns them (position 0 null; K entries keyed by token id when
    the actual token is in the top K, else K+1 with it added), normalised by the client's own code.
    The actual token is the likeliest on even positions and outside the top K on odd ones."""
    from opd.serving.vllm_client import PromptScores, normalise_topk_rows

    rows: list[dict | None] = [None]
    for position, token in enumerate(ids[1:], start=1):
        others = {(token + j) % 30000 + 1: {"logprob": -0.1 * (j + 1)} for j in range(1, k + 1)}
        if position % 2 == 0:
            rows.append({token: {"logprob": -0.05}, **dict(list(others.items())[: k - 1])})
        else:
            rows.append({**dict(list(others.items())[:k]), token: {"logprob": -9.0}})
    top_ids, top_lps, actual = normalise_topk_rows(ids, rows, k)
    return PromptScores(top_ids, top_lps, actual)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_opd_scores_the_exact_sampled_ids_in_each_format(families, family: str) -> None:
    """A turn with a next state is judged; the hinted teacher's prompt is the template's rendering
    of the context with the hint, followed by exactly the ids the student sampled in that turn;
    the teacher's rows land on those positions."""
    from opd.distill.teacher import with_hint

    directory, tokenizer, fmt = families[family]
    think = {"qwen3": "<think>\nPlan.\n</think>\n\n", "deepseek_r1_distill": "Plan.\n</think>\n\n",
             "gpt_oss": "<|channel|>analysis<|message|>Plan.<|end|><|start|>assistant"}.get(family, "")
    answer = "<|channel|>final<|message|>Done.<|return|>" if family == "gpt_oss" else "Done."
    replies = [think + _write(fmt, family, "def add_3(x):\n    return x + 3\n"), think + answer]
    client = ScriptedClient(generate=vllm_like(tokenizer, replies), chat=lambda messages, n: [f"\\boxed{{1}}\n[HINT_START]{HINT}[HINT_END]"] * n,
                            score=_prompt_rows)
    cfg = validate(compose([f"model={family}", "env=opd_coding", "group_size=1", f"server.model={directory}", "judge_votes=1", "distill_topk=5"]))
    env = build_env(cfg, TaskSet(train=[TASK], eval=[], source="test"), str(directory), client, max_attempts=1)
    group = collect(env, TASK)
    detail, tokens = group["overrides"][0], group["tokens"][0]
    (turn,) = detail["opd_turns"]
    assert turn["scored"] and turn["hint"] == HINT and turn["next_state_role"] == "tool"
    start, end = turn["span"]
    (scored,) = client.scored
    assert scored[-(end - start):] == tokens[start:end]
    context = group["messages"][0][: turn["message_index"]]
    prefix = fmt.render_ids(tokenizer, with_hint(context, HINT, "last_user"), coding_prompt.TOOLS, add_generation_prompt=True)
    assert scored == prefix + tokens[start:end]
    # The teacher's rows land on the student's tokens: where the sampled token is in the teacher's
    # top K it comes first, elsewhere it is outside the K kept; its own logprob is recorded either way.
    for position in range(start, end):
        row, lp = group["distill_token_ids"][0][position], detail["teacher_logprobs"][position]
        assert len(row) == 5
        if (len(scored) - (end - position)) % 2 == 0:
            assert row[0] == tokens[position] and lp == -0.05
        else:
            assert tokens[position] not in row and lp == -9.0
    # The judge's prompt goes to the server as text, which it tokenizes itself: the turn's markers
    # (and any control-token text a program printed) reach it defused, never as control tokens.
    judged = client.chats[0]["messages"][-1]["content"]
    assert not holds_added_token(tokenizer, judged) and "solution.py" in judged
