"""The inference servers' schemas (conf/server/): vLLM started by the run, or running servers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from omegaconf import MISSING

from opd.config.checks import at_least, checked, each, join, nonempty, one_of, relation, require, url


@dataclass
class ServerConfig:
    """What every kind of server setting has (conf/server/local.yaml documents each field)."""

    kind: str = MISSING
    model: str = MISSING
    max_model_len: int = checked(at_least(16))
    max_logprobs: int = checked(at_least(1))
    request_timeout_s: float = checked(at_least(0.1))
    max_requests_in_flight: int = checked(at_least(1))
    max_attempts: int = checked(at_least(1))
    api_key: str = checked(nonempty("a non-empty string"))
    keepalive_s: float = checked(at_least(0.1))
    unreachable_timeout_s: float = checked(at_least(0))


@dataclass
class LocalServerConfig(ServerConfig):
    """server=local: vLLM started by the run (conf/server/local.yaml)."""

    kind: str = checked(one_of("local"))
    dtype: str = MISSING
    tool_call_parser: Optional[str] = MISSING
    reasoning_parser: Optional[str] = MISSING
    chat_template: Optional[str] = MISSING
    cpu_kv_cache_gib: int = checked(at_least(1))
    enforce_eager: bool = MISSING
    startup_timeout_s: float = checked(at_least(1))
    extra_args: list[str] = MISSING
    environment: dict[str, str] = MISSING
    max_restarts: int = checked(at_least(0))


@dataclass
class RemoteServerConfig(ServerConfig):
    """server=vllm: running servers (conf/server/vllm.yaml)."""

    kind: str = checked(one_of("vllm"))
    base_urls: list[str] = checked(nonempty("a non-empty list when server.kind=vllm"), each(url(), "http(s) URLs"))


@relation(LocalServerConfig)
def server_keeps_connections_longer_than_the_client(server: LocalServerConfig, at: str) -> None:
    """A local server's own idle timeout, when `environment` sets it, above the client's keepalive_s."""
    own = server.environment.get("VLLM_HTTP_TIMEOUT_KEEP_ALIVE")
    if own is not None:
        require(str(own).isdigit() and int(own) > server.keepalive_s, join(at, "environment.VLLM_HTTP_TIMEOUT_KEEP_ALIVE"),
                f"whole seconds above {join(at, 'keepalive_s')}={server.keepalive_s:g} (the client must close an idle connection first)", own)
