"""What the runner does when groups fail because the inference server went away.

After a failed group the runner asks `ServerWatch.check()` (one check at a time; no new groups
start meanwhile). If every server answers /health, the failure was the group's own and the run
goes on. Otherwise:
- the embedded server (server=local) is restarted on the same port, at most
  `server.max_restarts` times in a run, then the run ends with `ServerLost`;
- running servers (server=vllm) are polled with exponential backoff until they answer again or
  `server.unreachable_timeout_s` has passed, then the run ends with `ServerLost`.
teacher=model's servers have a watch of their own (`teacher.server.max_restarts` for its local
server), checked after the policy's (`Watches`); a restarted teacher keeps its weights, so the
hooks that load a trainer's weights run after the policy's restarts only.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.error
import urllib.request
from typing import Any, Awaitable, Callable

from opd.config import ConfigError

logger = logging.getLogger(__name__)


class ServerLost(RuntimeError):
    """The inference server is gone and could not be brought back."""


def healthy(base_url: str, timeout: float = 3.0) -> bool:
    """GET <server>/health answers 200."""
    try:
        with urllib.request.urlopen(base_url.removesuffix("/v1").rstrip("/") + "/health", timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def check_servers(urls: list[str], model: str | None, key: str, model_key: str, timeout_s: float = 10.0) -> None:
    """Before a run uses running servers: each of `urls` answers /health and, where it lists its
    models (/v1/models), serves `model` (None: any). A server that was never up fails here within seconds
    (a ConfigError naming `key`, or `model_key` for the model), not after the outage wait."""
    for url in urls:
        root = url.removesuffix("/v1").rstrip("/")
        try:
            with urllib.request.urlopen(root + "/health", timeout=timeout_s):
                pass
        except urllib.error.HTTPError as err:
            raise ConfigError(f"{key}: {url} answers /health with HTTP {err.code}; is it a vLLM server's /v1 address?", key) from None
        except (urllib.error.URLError, OSError, ValueError) as err:
            reason = getattr(err, "reason", err)
            raise ConfigError(f"{key}: nothing answers at {url} ({reason}); start the server first, or fix the address", key) from None
        try:
            with urllib.request.urlopen(url.rstrip("/") + "/models", timeout=timeout_s) as response:
                served = [str(m.get("id")) for m in json.load(response).get("data", [])]
        except (urllib.error.URLError, OSError, ValueError, AttributeError):
            continue  # a server that does not list its models: requests will say
        if model is not None and served and model not in served:
            raise ConfigError(f"{model_key}: {model!r} is not served at {url}; it serves {', '.join(served)}", model_key)


class ServerWatch:
    def __init__(self, urls: list[str], local: Any = None, max_restarts: int = 2, unreachable_timeout_s: float = 300.0,
                 name: str = "policy", restarts_key: str = "server.max_restarts") -> None:
        self.urls = list(urls)
        self.local = local
        self.max_restarts = max_restarts
        self.unreachable_timeout_s = unreachable_timeout_s
        # Whose servers these are, in log lines and errors ("policy", "teacher"), and the config
        # key that bounds the local server's restarts.
        self.name, self.restarts_key = name, restarts_key
        self.restarts = 0
        self.outages = 0
        # Called after a restart: the restarted server holds the weights it was started with
        # (a closed loop's trainer loads its current ones again).
        self.after_restart: list[Callable[[], Awaitable[None]]] = []
        self._lock = asyncio.Lock()

    async def _down(self) -> list[str]:
        states = await asyncio.gather(*(asyncio.to_thread(healthy, url) for url in self.urls))
        return [url for url, ok in zip(self.urls, states) if not ok]

    async def check(self, cause: BaseException | None = None) -> None:
        """Return when the servers answer again; raise ServerLost when they will not."""
        async with self._lock:
            down = await self._down()
            if not down:
                return
            self.outages += 1
            if self.local is not None:
                await self._restart(down, cause)
            else:
                await self._wait(down)

    async def _restart(self, down: list[str], cause: BaseException | None) -> None:
        if self.restarts >= self.max_restarts:
            raise ServerLost(
                f"the {self.name}'s embedded vLLM server at {down[0]} died again after {self.restarts} restart(s) "
                f"({self.restarts_key}={self.max_restarts}); see {self.local.log_path}"
            ) from cause
        self.restarts += 1
        logger.error("the %s's embedded vLLM server at %s is down; restarting it (%d/%d)", self.name, down[0], self.restarts, self.max_restarts)
        await asyncio.to_thread(self.local.restart)
        for hook in self.after_restart:
            await hook()

    async def _wait(self, down: list[str]) -> None:
        started = time.monotonic()
        delay = 1.0
        while True:
            waited = time.monotonic() - started
            if waited >= self.unreachable_timeout_s:
                raise ServerLost(
                    f"the {self.name}'s server(s) {', '.join(down)} unreachable for {waited:.0f} s "
                    f"(server.unreachable_timeout_s={self.unreachable_timeout_s:g}); is it running?"
                )
            logger.error("the %s's server(s) %s not answering /health; retrying in %.0f s", self.name, ", ".join(down), delay)
            await asyncio.sleep(min(delay, max(0.1, self.unreachable_timeout_s - waited)))
            delay = min(delay * 2, 30.0)
            down = await self._down()
            if not down:
                logger.warning("the %s's servers answer again after %.0f s", self.name, time.monotonic() - started)
                return


class Watches:
    """The run's watches checked in turn after a failed group: the policy's servers, then
    teacher=model's (None: no watch of its own, e.g. a teacher on the policy's server)."""

    def __init__(self, *watches: ServerWatch | None) -> None:
        self.watches = [w for w in watches if w is not None]

    async def check(self, cause: BaseException | None = None) -> None:
        for watch in self.watches:
            await watch.check(cause)
