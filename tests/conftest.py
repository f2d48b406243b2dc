"""Shared fixtures: the composed config tree, the fixture model, one real vLLM server per session."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"


def compose(overrides: list[str] | None = None):
    """The real config tree composed like the launcher does (output_dir filled in)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from opd.config import register

    register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=["output_dir=/tmp/opd-test-unused", *(overrides or [])])


@pytest.fixture(scope="session")
def fixture_model() -> str:
    from opd.fixture.build import ensure_fixture

    override = os.environ.get("OPD_FIXTURE_DIR")
    return override or str(ensure_fixture())


@pytest.fixture(scope="session")
def tokenizer(fixture_model: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(fixture_model)


def _vllm_server(fixture_model: str, workdir: Path) -> Iterator[str]:
    """A real vLLM OpenAI server on the fixture model (top-20 logprobs), stopped afterwards."""
    from opd.serving.local_vllm import LocalVLLM, LocalVLLMSettings

    settings = LocalVLLMSettings(model=fixture_model, served_model_name=fixture_model, workdir=workdir, max_logprobs=20, startup_timeout_s=300)
    with LocalVLLM(settings) as server:
        yield server.base_url


@pytest.fixture(scope="session")
def vllm_url(fixture_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real vLLM server, started once for the whole session."""
    yield from _vllm_server(fixture_model, tmp_path_factory.mktemp("vllm"))


@pytest.fixture(scope="session")
def vllm_url_2(fixture_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A second real vLLM server (multi-server balancing)."""
    yield from _vllm_server(fixture_model, tmp_path_factory.mktemp("vllm2"))
