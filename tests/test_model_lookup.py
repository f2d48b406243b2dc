"""A model that cannot be had fails in seconds with one line naming `server.model` and what to do;
the local vLLM server inherits the user's hub settings and the model's generation config."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, compose
from opd.config import validate
from opd.serving.model_lookup import ModelNotFound, find_model


def test_a_missing_directory_or_a_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFound, match=r"server.model='/no/such/model': no such directory") as raised:
        find_model("/no/such/model")
    assert raised.value.key == "server.model"
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ModelNotFound, match="is a file, not a model directory"):
        find_model(str(tmp_path / "weights.bin"))
    assert find_model(str(tmp_path)) == str(tmp_path)


def test_a_hub_name_offline_and_not_cached_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ModelNotFound, match=r"server.model='Qwen/Qwen3-4B' is not a local directory nor in the Hugging Face cache.*HF_HUB_OFFLINE is set"):
        find_model("Qwen/Qwen3-4B")


def test_an_unreachable_hub_fails_in_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", "http://127.0.0.1:9")  # a closed port: refused at once
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    started = time.monotonic()
    with pytest.raises(ModelNotFound, match=r"server.model='Qwen/Qwen3-4B': the Hugging Face hub cannot be reached"):
        find_model("Qwen/Qwen3-4B")
    assert time.monotonic() - started < 15


def test_the_launcher_names_server_model_in_one_line(tmp_path: Path) -> None:
    """Before this check, a missing directory reached vLLM, which failed after its start-up with a
    traceback; now the launcher exits 2 with one line, before any server starts."""
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "experiments.launch", "model=qwen3", "server.model=/no/such/model", f"hydra.run.dir={tmp_path}",
                          "tracking.enabled=false"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    lines = [line for line in (out.stdout + out.stderr).splitlines() if "server.model" in line]
    assert len(lines) == 1 and "no such directory" in lines[0] and "Traceback" not in out.stderr
    assert not (tmp_path / "vllm" / "server.log").exists()
    assert time.monotonic() - started < 60


def test_the_local_server_keeps_the_users_hub_settings_and_the_models_generation_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from opd.serving.local_vllm import LocalVLLM

    settings = validate(compose(["model=qwen3", f"server.model={tmp_path}"])).server
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    server = LocalVLLM(settings, str(tmp_path), tmp_path / "vllm")
    try:
        assert "HF_HUB_OFFLINE" not in server.environment()
        monkeypatch.setenv("HF_HUB_OFFLINE", "0")
        assert server.environment()["HF_HUB_OFFLINE"] == "0"
        assert "--generation-config" not in server.command()
    finally:
        server.stop()
    assert os.path.isdir(tmp_path)
