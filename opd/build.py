"""Turn the validated config into objects: the inference server(s), the dataset, the environment.

The one place that knows every config group.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Iterator

from atroposlib.envs.server_handling.server_baseline import APIServerConfig

from opd.config import Config, ConfigError
from opd.serving.watch import ServerWatch

logger = logging.getLogger(__name__)


def resolve_model(name: str) -> str:
    """"fixture" -> the project's fixture model directory (built if missing); else unchanged."""
    if name == "fixture":
        from opd.fixture.build import ensure_fixture

        return str(ensure_fixture())
    return name


def local_server(cfg: Config, model: str, workdir: Path):
    """A LocalVLLM (not started) with the settings of cfg.server."""
    from opd.serving.local_vllm import LocalVLLM, LocalVLLMSettings

    return LocalVLLM(LocalVLLMSettings(
        model=model,
        served_model_name=model,
        workdir=workdir,
        dtype=cfg.server.dtype,
        max_model_len=cfg.server.max_model_len,
        max_logprobs=cfg.server.max_logprobs,
        tool_call_parser=cfg.server.tool_call_parser,
        cpu_kv_cache_gib=cfg.server.cpu_kv_cache_gib,
        enforce_eager=cfg.server.enforce_eager,
        startup_timeout_s=cfg.server.startup_timeout_s,
        seed=cfg.seed,
        extra_args=list(cfg.server.extra_args),
    ))


@contextlib.contextmanager
def inference_servers(cfg: Config, model: str, workdir: Path, shared: list[str] | None = None) -> Iterator[tuple[list[str], ServerWatch]]:
    """Yield the /v1 base URLs to use (server=vllm's URLs, a sweep's shared server, or a local
    server started here and always stopped) and the watch that handles their outages."""
    limits = {"max_restarts": cfg.server.max_restarts, "unreachable_timeout_s": cfg.server.unreachable_timeout_s}
    if cfg.server.kind == "vllm":
        yield list(cfg.server.base_urls), ServerWatch(list(cfg.server.base_urls), **limits)
        return
    if shared:
        logger.info("using the sweep's shared inference server %s", ", ".join(shared))
        yield list(shared), ServerWatch(list(shared), **limits)
        return
    with local_server(cfg, model, workdir) as server:
        yield [server.base_url], ServerWatch([server.base_url], local=server, **limits)


def server_configs(cfg: Config, model: str, base_urls: list[str]) -> list[APIServerConfig]:
    return [
        APIServerConfig(
            model_name=model,
            base_url=url,
            api_key=cfg.server.api_key,
            timeout=int(max(1, cfg.server.request_timeout_s)),
            num_max_requests_at_once=cfg.server.max_requests_in_flight,
            num_requests_for_eval=cfg.server.max_requests_in_flight,
            server_type="vllm",
            health_check=False,
        )
        for url in base_urls
    ]


def groups_in_flight(cfg: Config, servers: int) -> int:
    """runner.groups_in_flight, or (null) enough groups to keep every server request slot busy."""
    from opd.runner import groups_to_fill

    if cfg.runner.groups_in_flight is not None:
        return cfg.runner.groups_in_flight
    return groups_to_fill(cfg.server.max_requests_in_flight * servers, cfg.group_size, cfg.runner.oversubscribe)


def load_data(cfg: Config):
    """The environment's dataset (loaded before any server starts, so bad paths fail first)."""
    if cfg.env.name == "inline_math":
        from opd.data.math_sets import load_math

        if cfg.dataset.source == "humaneval":
            raise ConfigError("dataset.source: humaneval holds coding tasks; env=inline_math needs math problems")
        data = load_math(cfg.dataset)
    elif cfg.env.name == "opd_coding":
        from opd.data.coding_sets import load_coding

        data = load_coding(cfg.dataset)
    else:
        raise ConfigError(f"env.name: unknown environment {cfg.env.name!r}")
    logger.info("dataset %s: %d train, %d eval items", data.source, len(data.train), len(data.eval))
    return data


def judge_server(cfg: Config):
    """A ServerManager for judge=server (None: the judge uses the policy's server)."""
    if cfg.judge.kind != "server":
        return None
    from opd.serving.slots import SlotServerManager
    from opd.serving.vllm_client import OpenAIVLLMServer

    config = APIServerConfig(
        model_name=cfg.judge.model, base_url=cfg.judge.base_url, api_key=cfg.judge.api_key,
        timeout=int(max(1, cfg.server.request_timeout_s)), server_type="vllm", health_check=False,
    )
    return SlotServerManager([config], server_class=OpenAIVLLMServer)


def build_env(cfg: Config, data, model: str, base_urls: list[str]):
    """The configured environment over the given servers."""
    common = {
        "tokenizer_path": model,
        "server_configs": server_configs(cfg, model, base_urls),
        "max_model_len": cfg.server.max_model_len,
        "seed": cfg.seed,
    }
    if cfg.env.name == "inline_math":
        from opd.envs.inline_math import InlineMathEnv

        return InlineMathEnv(cfg.env, cfg.reward, data, **common)
    if cfg.env.name == "opd_coding":
        from opd.envs.opd_coding import OPDCodingEnv

        return OPDCodingEnv(cfg.env, cfg.reward, cfg.judge, data, judge_server=judge_server(cfg), **common)
    raise ConfigError(f"env.name: unknown environment {cfg.env.name!r}")
