"""Every real-model preset, both environments, through real vLLM on a CPU: a tiny random-weight
model of the family's real architecture with its real tokenizer and chat template
(opd.fixture.families), served by vLLM started with exactly the preset's arguments (parsers,
reasoning parser, chat template, --max-logprobs; the opd_coding context length, which covers
inline_math's). Random weights write noise: it must come back as valid records (noise counted as
format violations, never a crash), and the model must compute: a tiny model whose sampled tokens
all have one logprob (gpt-oss's tied output layer, which vLLM's GptOssForCausalLM never loads,
gave -ln(vocab) everywhere) is no test of the pipeline. Each server has the preset's start-up
timeout (gpt-oss's is longer). One server per family serves both environments (qwen2_5 and
qwen2_5_coder share one: their server arguments are the same); the next family's server starts
while this one's runs go."""

from __future__ import annotations

import contextlib
import shlex
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import pytest

from conftest import ROOT, compose
from opd.config import validate
from opd.fixture.families import build_model
from opd.records import check_group, read_groups
from opd.serving.local_vllm import LocalVLLM

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

# preset -> the family whose tiny model it serves.
PRESETS = {"qwen3": "qwen3", "qwen2_5": "qwen2_5", "qwen2_5_coder": "qwen2_5", "llama3": "llama3", "mistral": "mistral",
           "deepseek_r1_distill": "deepseek_r1_distill", "gpt_oss": "gpt_oss"}
# Budgets cut for time on 2 CPU cores (the server keeps the preset's context length): random
# weights never write a tool call, so a rollout is one turn, cut at max_tokens or ended by a
# special token; inline_math's two segments still take the continuation path.
BUDGETS = {"opd_coding": ["env.max_tokens_per_turn=48", "env.max_turns=2"],
           "inline_math": ["env.max_tokens_per_segment=24", "env.max_new_tokens=48"]}
STEPS = 1
# The README's real-model command (the tiny Qwen3 in opd_coding), run here as written but for its
# server: its overrides, with this test's running server in place of the model path it builds.
README_COMMAND = "python -m experiments.launch model=qwen3 server.model=/tmp/tiny-qwen3 env=opd_coding "


def readme_overrides() -> list[str]:
    """The README command's overrides but `server.model` (test_readme checks the command is there)."""
    (line,) = [line.strip() for line in (ROOT / "README.md").read_text().splitlines() if line.strip().startswith(README_COMMAND)]
    return [arg for arg in shlex.split(line, comments=True)[3:] if not arg.startswith("server.model=")]


FAMILIES = ["qwen3", "qwen2_5", "llama3", "mistral", "deepseek_r1_distill", "gpt_oss"]


class FamilyServers:
    """Each family's tiny model served by vLLM with its preset's arguments, started one family
    ahead: the next family's server starts (in a thread) while this family's runs go, so two
    servers are up at most and the start-ups overlap the runs instead of following them."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory, families: list[str]) -> None:
        self.tmp_path_factory, self.families = tmp_path_factory, families
        self.pool = ThreadPoolExecutor(max_workers=2)
        self.started: dict[str, tuple[str, LocalVLLM, Future]] = {}

    def _start(self, family: str) -> None:
        if family in self.started:
            return
        model = str(build_model(family, self.tmp_path_factory.mktemp(f"{family}-model")))
        settings = validate(compose([f"model={family}", "env=opd_coding", f"server.model={model}"])).server
        server = LocalVLLM(settings, model, self.tmp_path_factory.mktemp(f"{family}-vllm"))
        self.started[family] = (model, server, self.pool.submit(server.start))

    def serve(self, family: str) -> tuple[str, str]:
        """(the family's model directory, its server's URL), once it is healthy; the next family's starts."""
        self._start(family)
        later = self.families[self.families.index(family) + 1:]
        if later:
            self._start(later[0])
        model, _, future = self.started[family]
        return model, future.result()

    def stop(self, family: str) -> None:
        _, server, future = self.started.pop(family)
        with contextlib.suppress(Exception):  # a failed start was stopped by LocalVLLM itself
            future.result()
        server.stop()

    def close(self) -> None:
        for family in list(self.started):
            self.stop(family)
        self.pool.shutdown()


@pytest.fixture(scope="module")
def family_servers(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FamilyServers]:
    # Only the families this session runs, in the order it runs them.
    wanted = {item.callspec.params["served"] for item in request.session.items if "served" in getattr(getattr(item, "callspec", None), "params", {})}
    servers = FamilyServers(tmp_path_factory, [f for f in FAMILIES if f in wanted])
    try:
        yield servers
    finally:
        servers.close()


@pytest.fixture(scope="module", params=FAMILIES)
def served(request: pytest.FixtureRequest, family_servers: FamilyServers) -> Iterator[tuple[str, str, str]]:
    """(family, its tiny model's directory, the URL of vLLM serving it with the preset's arguments)."""
    family = request.param
    model, url = family_servers.serve(family)
    try:
        yield family, model, url
    finally:
        family_servers.stop(family)


def _run(tmp_path: Path, preset: str, env: str, model: str, url: str) -> tuple[list[dict], int]:
    """The preset's run in `env` (the README's command for its own preset and env, else the cut
    budgets): its groups and how many it was asked for."""
    from experiments.launch import launch

    out = tmp_path / f"{preset}-{env}"
    readme = preset == "qwen3" and env == "opd_coding"
    overrides = readme_overrides() if readme else [f"model={preset}", f"env={env}", f"total_steps={STEPS}", "group_size=2", "judge_votes=1", *BUDGETS[env]]
    steps = next(int(o.split("=", 1)[1]) for o in overrides if o.startswith("total_steps="))
    # MLflow is off: what is checked here is the records (tracking has tests of its own).
    launch(compose([*overrides, "server=vllm", f"server.model={model}", f"server.base_urls=[{url}]", f"output_dir={out}", "tracking.enabled=false",
                    "runner.progress=false"]))
    return list(read_groups(out / "groups.jsonl")), steps


@pytest.mark.parametrize("env", ["inline_math", "opd_coding"])
def test_each_preset_writes_valid_records_through_vllm(served, env: str, tmp_path: Path) -> None:
    family, model, url = served
    for preset in [p for p, f in PRESETS.items() if f == family]:
        groups, steps = _run(tmp_path, preset, env, model, url)
        assert len(groups) == steps, preset
        for group in groups:
            assert check_group(group) == [], preset
            # Every rollout generated something, as vLLM sampled it (ids with their logprobs).
            sampled = []
            for detail, masks, logprobs in zip(group["overrides"], group["masks"], group["inference_logprobs"]):
                assert detail["generated_tokens"] > 0
                assert sum(m != -100 for m in masks) == sum(lp != 1.0 for lp in logprobs) > 0
                sampled += [round(lp, 3) for m, lp in zip(masks, logprobs) if m != -100]
            # The model computes something: its logprobs are not one constant (a flat output layer).
            assert len(set(sampled)) > 1, f"{preset}: every sampled token has logprob {sampled[0]}"
            if env == "inline_math":
                # Noise is a format violation, scored as the flat penalty, never a crash.
                assert all(d["reward_signals"]["format_violation"] in (0.0, 1.0) for d in group["overrides"])
