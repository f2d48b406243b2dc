"""Records never pass the model's context: a tool output of 20,000 rare characters (60,000-80,000
tokens for the real tokenizers) is cut to what the context has left, and says so, or the rollout
ends with `finish: context` before it; for the fixture and every real family's preset, with its
real tokenizer and official chat template (opd.fixture.families)."""

from __future__ import annotations

import asyncio

import pytest

from conftest import compose, family_tokenizer, one_fast
from opd.agent.chat_format import ChatFormat
from opd.agent.chat_tokens import special_ids
from opd.agent.context import NEXT_TURN_MIN, cut_text, fit_texts
from opd.agent.loop import AgentLimits, run_agent
from opd.agent.tool_calls import ToolCall
from opd.config import validate
from opd.serving.tokenizer import load_tokenizer
from opd.serving.vllm_client import Generation
from opd.tools.registry import Tool, Toolbox

FAMILIES = ["fixture", "qwen3", "llama3", "gpt_oss", "mistral", "qwen2_5", "deepseek_r1_distill"]
# 20,000 characters of the supplementary planes: several tokens each, for every tokenizer.
RARE = "".join(chr(0x10400 + (i * 7919) % 0x1C00) for i in range(20_000))
CUT = "the model's context has no room for more]"


def _family(name: str):
    return family_tokenizer(name), validate(compose([f"model={name}", "env=opd_coding"]))


class Parser:
    """Reads a call in every turn that holds the format's call start (the parsers are not under test)."""

    def __init__(self, fmt: ChatFormat) -> None:
        self.fmt = fmt

    async def get(self) -> "Parser":
        return self

    def parse(self, text: str, ids: list[int]):
        class Parsed:
            calls = [ToolCall("read_file", {"path": "big.txt"})] if self.fmt.call_start in text or "read_file" in text else []

        return Parsed()


async def _read_file(context: object, arguments: dict[str, str]) -> str:
    return RARE


def _turn_ids(tokenizer, fmt: ChatFormat, text: str) -> list[int]:
    """A scripted turn's ids, ended the way the family's server would stop it."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if ids and ids[-1] in special_ids(tokenizer):
        return ids
    end = "<|call|>" if fmt.harmony and "to=functions" in text else ("<|return|>" if fmt.harmony else None)
    return ids + [tokenizer.convert_tokens_to_ids(end) if end else tokenizer.eos_token_id]


@pytest.mark.parametrize("name", one_fast(FAMILIES, ("fixture", "qwen3")))
def test_a_20000_character_tool_output_leaves_every_record_within_the_context(name: str) -> None:
    tokenizer, cfg = _family(name)
    fmt = ChatFormat.from_config(cfg.model)
    limit, per_turn = cfg.server.max_model_len, cfg.env.max_tokens_per_turn
    assert limit == cfg.model.opd_coding.max_model_len
    call = fmt.call_text("read_file", {"path": "big.txt"})
    if fmt.harmony:
        call = call.removesuffix("<|call|>")
    turns = [call] * 5 + ["<|channel|>final<|message|>Done." if fmt.harmony else "Done."]
    asked: list[tuple[int, int]] = []

    async def generate(prompt_ids: list[int], *, max_tokens: int, temperature: float) -> Generation:
        asked.append((len(prompt_ids), max_tokens))
        ids = _turn_ids(tokenizer, fmt, turns.pop(0))[:max_tokens]
        return Generation(ids, [-0.5] * len(ids), "stop")

    tool = Tool("read_file", "Read a file.", (("path", "the file"),), _read_file)
    messages = [{"role": "system", "content": "Solve it."}, {"role": "user", "content": "Read big.txt."}]
    rollout = asyncio.run(run_agent(tokenizer=tokenizer, messages=messages, toolbox=Toolbox([tool]), generate=generate,
                                    limits=AgentLimits(6, per_turn, limit), temperature=1.0, fmt=fmt, parser=Parser(fmt)))
    tokens = rollout.sequence.tokens
    assert len(tokens) <= limit, (len(tokens), limit)
    assert all(prompt + budget <= limit and budget >= 1 for prompt, budget in asked)
    # The first read is cut and says so; it leaves the next turn its room.
    results = [m for m in rollout.messages if m["role"] == "tool"]
    assert results and results[0]["content"].endswith(CUT) and RARE.startswith(results[0]["content"].split("\n[output cut")[0])
    assert asked[1][1] >= min(per_turn, NEXT_TURN_MIN)
    assert CUT in tokenizer.decode(tokens)
    # Later reads find the context full: the rollout ends with `context` before passing it.
    assert rollout.finish == "context" and len(rollout.turns) < 6


def test_cuts_fit_the_room_and_keep_the_longest_prefix_found() -> None:
    """`fit_texts` on a measure of characters: within the room, each text cut to one length, the
    note saying how much is shown; nothing that does not fit even emptied."""
    def measure(texts: list[str]) -> int:
        return sum(len(t) for t in texts)

    texts = ["a" * 5000, "b" * 100]
    assert fit_texts(measure, texts, 10_000) == texts
    cut = fit_texts(measure, texts, 3000)
    assert measure(cut) <= 3000 and measure(cut) >= 3000 - 3000 // 200 - 8
    assert cut[1] == "b" * 100 and cut[0].startswith("a" * 1000) and "characters: the model's context" in cut[0]
    assert fit_texts(measure, texts, 10) is None
    assert cut_text("abc", 5) == "abc" and cut_text("abcdef", 2).startswith("ab\n[output cut to 2 of 6 characters")


def test_inline_math_cuts_a_tool_response_to_the_context(fixture_model: str) -> None:
    """inline_math: a python call that prints rare characters (the sandbox keeps 2,000 of them:
    about 8,000 tokens) gets them cut to what the context has left, and the record stays within
    max_model_len; a second call finds no room and ends the rollout with `context`."""
    from opd.data.sources import TaskSet
    from opd.records import check_group
    from scripted import ScriptedClient, build_env

    cfg = validate(compose(["env=inline_math", "group_size=1", "env.max_tool_calls=3", "env.max_new_tokens=4000"]))
    tokenizer = load_tokenizer(fixture_model)
    fmt = ChatFormat.from_config(cfg.model)
    code = "print(''.join(chr(0x10400 + (i * 7919) % 0x1C00) for i in range(20000)))"
    call = "<think>\n" + fmt.call_text("python_interpreter", {"code": code})
    script = [call, call, "</think>\\boxed{4}"]

    def generate(prompt_ids, *, max_tokens, stop=None) -> Generation:
        text = script.pop(0)
        ids = tokenizer.encode(text, add_special_tokens=False)
        if not text.endswith(fmt.call_end):
            ids.append(tokenizer.eos_token_id)
        return Generation(ids[:max_tokens], [-0.5] * len(ids[:max_tokens]), "stop" if len(ids) <= max_tokens else "length")

    item = {"id": "m-1", "problem": "What is 2 + 2?", "answer": "4"}
    env = build_env(cfg, TaskSet(train=[item], eval=[], source="test"), fixture_model, ScriptedClient(generate=generate), max_attempts=1)

    async def run():
        try:
            return await env.collect_trajectories(item)
        finally:
            await env.close()

    group, _ = asyncio.run(run())
    (tokens,) = group["tokens"]
    assert len(tokens) <= cfg.server.max_model_len
    assert check_group(group) == [] and group["generation_params"]["max_model_len"] == cfg.server.max_model_len
    assert CUT in tokenizer.decode(tokens)
    assert group["overrides"][0]["finish"] == "context"


def test_opd_coding_reading_a_20000_character_file_stays_within_the_context(fixture_model: str) -> None:
    """The whole environment (real workspace, real file tools): the agent writes a file of 20,000
    rare characters (env.max_file_chars) and reads it back; the record the runner would write is
    within the fixture's 4,096 tokens and passes the record rules, the read result says it was cut."""
    from opd.agent.tool_calls import tool_call_text
    from opd.data.sources import TaskSet
    from opd.records import check_group
    from scripted import ScriptedClient, build_env

    cfg = validate(compose(["env=opd_coding", "group_size=1", "env.opd.enabled=false"]))
    assert cfg.env.max_file_chars >= len(RARE)
    tokenizer = load_tokenizer(fixture_model)
    turns = [tool_call_text("write_file", {"path": "big.txt", "content": "x"}), tool_call_text("read_file", {"path": "big.txt"}), "Done."]

    def generate(prompt_ids, *, max_tokens, stop=None) -> Generation:
        ids = tokenizer.encode(turns.pop(0) + "<|im_end|>", add_special_tokens=False)[:max_tokens]
        return Generation(ids, [-0.5] * len(ids), "stop")

    task = {"id": "t-big", "task": "Read big.txt.", "test_code": "print('All tests passed!')\n"}
    env = build_env(cfg, TaskSet(train=[task], eval=[], source="test"), fixture_model, ScriptedClient(generate=generate), max_attempts=1)
    import opd.tools.workspace as workspace

    original = workspace.Workspace.write_file

    def write_big(self, path: str, content: str):  # the model cannot write 80,000 tokens in one turn: the file is written for it
        return original(self, path, RARE if path == "big.txt" else content)

    async def run():
        workspace.Workspace.write_file = write_big
        try:
            return await env.collect_trajectories(task)
        finally:
            workspace.Workspace.write_file = original
            await env.close()

    group, _ = asyncio.run(run())
    (tokens,) = group["tokens"]
    assert len(tokens) <= cfg.server.max_model_len
    assert check_group(group) == []
    read = [m["content"] for m in group["messages"][0] if m["role"] == "tool"][1]
    assert read.endswith(CUT) and group["overrides"][0]["finish"] == "answer"
