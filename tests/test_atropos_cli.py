"""Our environments under atroposlib's own commands (opd/atropos/): its `process` command writes
valid groups from our inline_math env over a scripted OpenAI/vLLM-compatible server, and its
config starts from our defaults."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, compose
from opd.config import validate
from helpers import assert_taught
from opd.records import check_group, read_groups


@pytest.mark.parametrize("env_name", ["inline_math", "opd_coding"])
def test_atroposlib_config_starts_from_our_defaults_and_reads_back_as_overrides(env_name: str, fixture_model: str) -> None:
    from opd.atropos.inline_math import InlineMathAtropos
    from opd.atropos.opd_coding import OPDCodingAtropos

    cls = {"inline_math": InlineMathAtropos, "opd_coding": OPDCodingAtropos}[env_name]
    ours = validate(compose([f"env={env_name}"]))
    env_config, (server,) = cls.config_init()
    assert (env_config.group_size, env_config.total_steps, env_config.max_token_length) == (ours.group_size, ours.total_steps, ours.server.max_model_len)
    assert env_config.tokenizer_name == server.model_name == fixture_model and env_config.use_wandb is False
    assert server.num_max_requests_at_once == ours.server.max_requests_in_flight
    # atroposlib drops equal-score groups before a trainer for inline_math, as its default; opd_coding keeps them.
    assert env_config.ensure_scores_are_not_same is (env_name == "inline_math")
    # atroposlib's values (--env.*, --openai.*) come back as our config, with our own overrides last.
    env_config = env_config.model_copy(update={"group_size": 2, "total_steps": 3, "opd_overrides": ["model=qwen3", "seed=7"]})
    servers = [server.model_copy(update={"base_url": f"http://h{i}:8000/v1", "model_name": "Qwen/Qwen3-4B"}) for i in (1, 2)]
    cfg = cls.opd_config_for(env_config, servers)
    assert cfg.server.kind == "vllm" and cfg.server.base_urls == ["http://h1:8000/v1", "http://h2:8000/v1"] and cfg.server.model == "Qwen/Qwen3-4B"
    assert (cfg.group_size, cfg.total_steps, cfg.seed, cfg.model.name, cfg.env.name) == (2, 3, 7, "qwen3", env_name)
    assert cfg.server.max_model_len == ours.server.max_model_len  # atroposlib's max_token_length, which defaulted to ours


def test_a_teacher_kind_of_yours_that_needs_a_scorer_is_refused_under_atroposlibs_commands(fixture_model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """atroposlib's commands serve only teacher=model's scorer: before, a kind of yours that
    needs one ran without it and wrote groups without a teacher row."""
    from opd.atropos.inline_math import InlineMathAtropos
    from opd.config import ConfigError
    from test_teachers import scripted_kind

    scripted_kind(monkeypatch)
    with pytest.raises(ConfigError, match="^teacher.kind: under atroposlib's commands only teacher=model scores .* teacher=scripted needs a scorer") as info:
        InlineMathAtropos._teacher(validate(compose(["teacher.kind=scripted"])), fixture_model)
    assert info.value.key == "teacher.kind"
    assert InlineMathAtropos._teacher(validate(compose([])), fixture_model) is None  # teacher=none needs none


def atropos_process(tmp_path, url: str, model: str, out, overrides: list[str] = ()) -> subprocess.CompletedProcess:
    """atroposlib's `process` command on our inline_math env: 2 groups of 2 into `out`."""
    extra = ["--env.opd_overrides", json.dumps(list(overrides))] if overrides else []
    return subprocess.run(
        [sys.executable, "-m", "opd.atropos.inline_math", "process", "--env.total_steps", "2", "--env.group_size", "2",
         "--env.use_wandb", "false", "--env.data_path_to_save_groups", str(out), "--openai.base_url", url,
         "--openai.model_name", model, *extra],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled"},
    )


@pytest.mark.slow
def test_atroposlib_process_command_writes_our_groups(tmp_path, fixture_model: str) -> None:
    from experiments.bench import scripted_server

    out = tmp_path / "groups.jsonl"
    with scripted_server(0.01) as url:
        proc = atropos_process(tmp_path, url, fixture_model, out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    groups = list(read_groups(out))
    assert len(groups) == 2
    for group in groups:
        assert check_group(group) == [] and len(group["tokens"]) == 2
        assert group["inference_logprobs"] and group["overrides"][0]["reward_signals"]  # our record, not re-tokenised text
        assert group["scores"] == [-1.0, -1.0]  # the scripted answer 4 is wrong; atroposlib's process keeps equal scores


@pytest.mark.slow
def test_atroposlib_process_command_scores_every_sampled_token_with_a_running_teacher(tmp_path, fixture_model: str) -> None:
    from experiments.bench import scripted_server

    out = tmp_path / "groups.jsonl"
    with scripted_server(0.01) as url:
        # The scripted server scores prompts too: it is the teacher's running server.
        proc = atropos_process(tmp_path, url, fixture_model, out, ["teacher=model", "teacher.server.model=fixture", f"teacher.server.base_url={url}",
                                                                    "distill_topk=4"])
        assert proc.returncode == 0, proc.stderr[-3000:]
        groups = list(read_groups(out))
        assert len(groups) == 2
        for group in groups:
            assert_taught(group, topk=4)
        # Without a running teacher server the command refuses to start, naming the key.
        refused = atropos_process(tmp_path, url, fixture_model, tmp_path / "none.jsonl", ["teacher=model", "teacher.server.model=fixture"])
    assert refused.returncode != 0 and "teacher.server.base_url: under atroposlib's commands teacher=model scores on a running server" in refused.stderr
    assert not (tmp_path / "none.jsonl").exists()
