"""The model's tokenizer is the one AutoTokenizer loads, and a run's start-up path imports neither
torch nor atroposlib's BaseEnv (they cost seconds before the first request)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from opd.fixture.families import tokenizer_dir
from opd.serving.tokenizer import cache_file, load_tokenizer, remembered_class

MESSAGES = [{"role": "system", "content": "Add."}, {"role": "user", "content": "What is 2 + 3? Ünïcode, tabs\tand  spaces."}]


def _same(a, b) -> None:
    text = a.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert text == b.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert a.encode(text, add_special_tokens=False) == b.encode(text, add_special_tokens=False)
    assert a.get_vocab() == b.get_vocab() and a.eos_token_id == b.eos_token_id


def test_the_class_autotokenizer_picked_is_remembered_per_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fixture_model: str) -> None:
    from transformers import AutoTokenizer

    monkeypatch.setenv("OPD_CACHE_DIR", str(tmp_path / "cache"))
    assert remembered_class(fixture_model) is None
    first = load_tokenizer(fixture_model)
    auto = AutoTokenizer.from_pretrained(fixture_model)
    # The fixture's tokenizer_config.json names PreTrainedTokenizerFast; AutoTokenizer (and so
    # vLLM's server) picks Qwen2Tokenizer from the model type: that is the class to use.
    assert json.loads((Path(fixture_model) / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert type(first) is type(auto) and type(auto).__name__ == "Qwen2Tokenizer"
    assert remembered_class(fixture_model) is type(auto)
    again = load_tokenizer(fixture_model)
    assert type(again) is type(auto)
    _same(again, auto)


@pytest.mark.slow
def test_changed_files_are_decided_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPD_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "llama"
    shutil.copytree(tokenizer_dir("llama3"), model)
    load_tokenizer(str(model))
    assert remembered_class(str(model)) is not None
    config = model / "tokenizer_config.json"
    config.write_text(config.read_text() + "\n")
    assert remembered_class(str(model)) is None
    # An unreadable cache is a miss, not an error.
    cache_file().write_text("{not json")
    assert remembered_class(str(model)) is None
    assert load_tokenizer(str(model)).get_vocab()


def test_a_hub_name_is_never_remembered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPD_CACHE_DIR", str(tmp_path / "cache"))
    assert remembered_class("Qwen/Qwen3-4B") is None
    assert not cache_file().exists()


@pytest.mark.slow
def test_building_an_environment_imports_neither_torch_nor_atroposlib_base(tmp_path: Path, fixture_model: str) -> None:
    """What a run does before its first request (config, data, tokenizer, the start-up check, the
    environment), in a fresh interpreter with the tokenizer's class remembered: no torch, no
    atroposlib BaseEnv, no vLLM. (vLLM's parsers, which import torch, load on the parser's thread;
    here that thread builds nothing, so that what the main thread imported can be read.)"""
    script = f"""
import sys
import opd.envs.base
opd.envs.base.TurnParser = lambda *args: None
import opd.experiment
from opd import build
from opd.config import compose, validate
from opd.tracking.traces import Tracer
cfg = validate(compose(["env=inline_math", "server=vllm", "server.model={fixture_model}", "server.base_urls=[http://127.0.0.1:9/v1]", "output_dir={tmp_path}/out"]))
env = build.environment(cfg, build.load_data(cfg), "{fixture_model}", build.server_pool(cfg, "{fixture_model}", cfg.server.base_urls), Tracer.off())
print(type(env.tokenizer).__name__, [m for m in ("torch", "atroposlib.envs.base", "sklearn", "wandb", "vllm") if m in sys.modules])
"""
    env = {**os.environ, "OPD_CACHE_DIR": str(tmp_path / "cache")}
    for run in ("AutoTokenizer", "the remembered class"):
        out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        tokenizer, heavy = out.stdout.strip().split(" ", 1)
        assert tokenizer == "Qwen2Tokenizer", run
    assert heavy == "[]"
