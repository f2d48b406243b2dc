"""Each model preset's format, end to end through both environments, with a tokenizer of the
family's shape built in the test (tests/family_tokenizers.py; no hub): a tool call, a malformed
call, a call after the answer, reasoning blocks, multi-turn exact tokens, and the start-up check.
Calls are read by vLLM's own parsers (the preset's --tool-call-parser / --reasoning-parser)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from conftest import compose
from family_tokenizers import FAMILIES, R1_STOCK, build_tokenizer
from opd.agent.chat_format import ChatFormat, ChatFormatError, TurnParser, check
from opd.agent.tool_calls import ToolCall, ToolCallError
from opd.config import ConfigError, validate
from opd.data.sources import TaskSet
from opd.envs import coding_prompt
from opd.records import MASK, check_group
from opd.serving.vllm_client import Generation
from scripted import ScriptedClient, build_env

FAMILY_NAMES = sorted(FAMILIES)
TASK = {"id": "t-add3", "task": "Write add_3(x) returning x + 3.", "test_code": "from solution import add_3\nassert add_3(1) == 4\n"}
MATH = {"id": "m0", "problem": "What is 2 + 3?", "answer": "5"}


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, object, ChatFormat]]:
    """Per family: its tokenizer's directory, the tokenizer, and its preset's format."""
    out = {}
    for name in FAMILY_NAMES:
        directory = tmp_path_factory.mktemp(name)
        tokenizer = build_tokenizer(name, directory)
        out[name] = (directory, tokenizer, ChatFormat.from_config(validate(compose([f"model={name}"])).model))
    return out


def vllm_like(tokenizer, replies: list[str]):
    """A scripted server that stops as vLLM does: on a stop string as text (the ids up to the
    token that completes it, whatever the tokenisation), else on the end of the reply, adding
    the end-of-turn token unless the reply already ends with a special token."""
    queue = list(replies)
    specials = set(tokenizer.all_special_ids)

    def generate(prompt_ids, *, max_tokens, stop=None) -> Generation:
        text = queue.pop(0)
        ids = tokenizer.encode(text, add_special_tokens=False)
        for marker in stop or []:
            at = text.find(marker)
            if at != -1:
                end = at + len(marker)
                cut = next(n for n in range(1, len(ids) + 1) if len(tokenizer.decode(ids[:n], skip_special_tokens=False)) >= end)
                return Generation(ids[:cut], [-0.5] * cut, "stop")
        if not ids or ids[-1] not in specials:
            ids = ids + [tokenizer.eos_token_id]
        return Generation(ids, [-0.5] * len(ids), "stop")

    return generate


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
    with pytest.raises(ChatFormatError, match=r"model 'my-qwen'.*llama3_json format needs the tokens \['<\|eot_id\|>', '<\|eom_id\|>', '<\|python_tag\|>'\]"):
        check(llama_fmt, qwen, coding_prompt.TOOLS, "my-qwen")
    stock = build_tokenizer("deepseek_r1_distill", tmp_path / "r1", template=R1_STOCK)
    r1_fmt = families["deepseek_r1_distill"][2]
    with pytest.raises(ChatFormatError, match=r"model 'r1'.*chat template of .*r1 does not render the tools \['write_file', 'read_file', 'terminal', 'patch'\]"):
        check(r1_fmt, stock, coding_prompt.TOOLS, "r1")
    # model.chat_template replaces the stock template, here and in vLLM (--chat-template).
    template = tmp_path / "r1_tools.jinja"
    template.write_text(FAMILIES["deepseek_r1_distill"].template)
    cfg = validate(compose(["model=deepseek_r1_distill", f"model.chat_template={template}"]))
    check(ChatFormat.from_config(cfg.model), stock, coding_prompt.TOOLS, "r1")
    assert cfg.server.chat_template == str(template)
    with pytest.raises(ChatFormatError, match="unknown_parser"):
        TurnParser(ChatFormat(tool_parser="unknown_parser"), qwen, coding_prompt.TOOLS)
    # The stock R1 template stops the environment before any generation.
    with pytest.raises(ChatFormatError, match="does not render the tools"):
        client = ScriptedClient(generate=vllm_like(stock, []))
        cfg = validate(compose(["model=deepseek_r1_distill", "env=opd_coding", f"server.model={tmp_path / 'r1'}"]))
        build_env(cfg, TaskSet(train=[TASK], eval=[], source="test"), str(tmp_path / "r1"), client)
    assert client.prompts == []


# ---- parsing one turn ----------------------------------------------------------------------

CALLS = {
    "qwen3": ('<tool_call>\n{"name": "terminal", "arguments": {"command": "ls"}}\n</tool_call>', "<tool_call>\n{'name': 'terminal'}\n</tool_call>"),
    "qwen2_5": ('<tool_call>\n{"name": "terminal", "arguments": {"command": "ls"}}\n</tool_call>', "<tool_call>\n{'name': 'terminal'}\n</tool_call>"),
    # R1's text starts inside <think> (the template opens it): a call comes after </think>.
    "deepseek_r1_distill": ('Ok.\n</think>\n\n<tool_call>\n{"name": "terminal", "arguments": {"command": "ls"}}\n</tool_call>',
                            "Ok.\n</think>\n\n<tool_call>\n{'name': 'terminal'}\n</tool_call>"),
    "llama3": ('{"name": "terminal", "parameters": {"command": "ls"}}<|eom_id|>', '{"name": "terminal", "parameters": {"command": "ls"}<|eom_id|>'),
    "mistral": ('[TOOL_CALLS][{"name": "terminal", "arguments": {"command": "ls"}}]', '[TOOL_CALLS][{"name": "terminal", "arguments": {"command": }]'),
}


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_a_call_and_a_malformed_call_in_each_format(families, family: str) -> None:
    _, tokenizer, fmt = families[family]
    parser = TurnParser(fmt, tokenizer, coding_prompt.TOOLS)
    good, bad = CALLS[family]
    assert parser.parse(good).calls == [ToolCall("terminal", {"command": "ls"})]
    # The call the preset shows the model (prompts, few-shots) is one its parser reads.
    thought = "Ok.\n</think>\n\n" if family == "deepseek_r1_distill" else ""
    assert parser.parse(thought + fmt.call_text("terminal", {"command": "ls"})).calls == [ToolCall("terminal", {"command": "ls"})]
    (error,) = parser.parse(bad).calls
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
    return text.removesuffix("</s>")  # Mistral's end of message is its end-of-turn token, added by the server


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_agent_turns_keep_exact_tokens_in_each_format(families, family: str) -> None:
    directory, tokenizer, fmt = families[family]
    think = {"qwen3": "<think>\nPlan.\n</think>\n\n", "deepseek_r1_distill": "Plan.\n</think>\n\n"}.get(family, "")
    bad = CALLS[family][1].removeprefix("Ok.\n</think>\n\n")
    replies = [think + _write(fmt, family, "def add_3(x):\n    return x + 3\n"), think + bad, think + "Done: add_3 is written."]
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
    if family != "deepseek_r1_distill":  # R1's template renders history differently from the live turn
        # The record decodes to the template's rendering of the whole conversation: nothing re-tokenised.
        decoded = tokenizer.decode(tokens, skip_special_tokens=False)
        assert fmt.render(tokenizer, messages, coding_prompt.TOOLS).startswith(decoded)


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
    "deepseek_r1_distill": ('I will compute 2 + 3.\n<tool_call>\n{"name": "calculator", "arguments": {"expr": "2 + 3"}}\n</tool_call>',
                            "<tool_call>\n{'name': 'calculator'}\n</tool_call>"),
    "llama3": ('<think>\nI will compute 2 + 3.\n{"name": "calculator", "parameters": {"expr": "2 + 3"}}<|eom_id|>',
               '<think>\n{"name": "calculator", "parameters": {"expr": }<|eom_id|>'),
    "mistral": ('<think>\nI will compute 2 + 3.\n[TOOL_CALLS][{"name": "calculator", "arguments": {"expr": "2 + 3"}}]</s>',
                '<think>\n[TOOL_CALLS][{"name": "calculator", "arguments": {"expr": }]</s>'),
}
ANSWER = "The tool gives 5.\n</think>\n\nThe answer is \\boxed{5}."


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_inline_math_runs_calls_in_each_format(families, family: str) -> None:
    _, tokenizer, fmt = families[family]
    call, bad = INLINE[family]
    env = env_for(families, family, "inline_math", [call, ANSWER])
    group = collect(env, MATH)
    details = group["overrides"][0]
    assert (details["tool_calls"], details["tool_errors"], details["correct"], details["finish"]) == (1, 0, True, "eos")
    assert details["reward_signals"]["format_violation"] == 0.0
    # The response the env inserted is the family's text, masked; the call's ids were sampled.
    text = tokenizer.decode(group["tokens"][0], skip_special_tokens=False)
    assert fmt.response_text({"value": 5}) in text
    inserted = [t for t, m in zip(group["tokens"][0], group["masks"][0]) if m == MASK]
    assert fmt.response_text({"value": 5}) in tokenizer.decode(inserted, skip_special_tokens=False)
    # The marker ends the sampled segment however it is tokenised (bytes for R1, one token elsewhere).
    assert text.count(fmt.call_end) >= 1
    # A malformed call: an error result, and the rollout goes on to its answer.
    env = env_for(families, family, "inline_math", [bad, ANSWER])
    details = collect(env, MATH)["overrides"][0]
    assert (details["tool_calls"], details["tool_errors"], details["correct"]) == (0, 1, True)
    # A call after the answer's </think>: the rollout ends there, a format violation.
    after = call.replace("<think>\n", "").replace("I will compute 2 + 3.\n", "Done.\n</think>\n\n\\boxed{5} ")
    env = env_for(families, family, "inline_math", [after if family != "deepseek_r1_distill" else "Done.\n</think>\n\n\\boxed{5} " + call.split("\n", 1)[1]])
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

    tokenizer = build_tokenizer("qwen2_5", tmp_path / "q")
    cfg = validate(compose(["model=qwen2_5", "model.tool_call_parser=no_such_parser", "env=inline_math", "group_size=2", f"server.model={tmp_path / 'q'}"]))
    client = ScriptedClient(generate=vllm_like(tokenizer, ["<think>I add.</think> \\boxed{5}"] * 8))
    env = build_env(cfg, TaskSet(train=[MATH], eval=[], source="test"), str(tmp_path / "q"), client)
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
