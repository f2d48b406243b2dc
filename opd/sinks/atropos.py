"""mode=serve: hand each written group to an Atropos trainer API (atroposlib's `run-api`).

The protocol is the one atroposlib environments speak: register with `POST /register-env` (the API
answers "wait for trainer to start" until a trainer has asked for its first batch), read the
trainer's batch size from `GET /info`, and before each `POST /scored_data` read `GET /status-env`
and wait while the API already holds `max_batches_offpolicy` batches the trainer has not taken.
Waiting is bounded by `serve.wait_timeout_s`; posts are retried with backoff, then the run fails.
The group is already in groups.jsonl when it is sent, so a failed post loses nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import aiohttp

from opd.config import ServeConfig
from opd.sinks.base import Sink, Written

logger = logging.getLogger(__name__)


class TrainerAPIError(RuntimeError):
    """The trainer API did not answer, or did not start / drain in time."""


class AtroposTrainer(Sink):
    """One environment's connection to the Atropos API."""

    def __init__(self, cfg: ServeConfig, group_size: int, max_token_length: int) -> None:
        self.cfg = cfg
        self.url = cfg.rollout_server_url.rstrip("/")
        self.group_size = group_size
        self.max_token_length = max_token_length
        self.env_id: int | None = None
        self.batch_size = 0
        self.sent = 0
        self.waited_s = 0.0
        self.session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.cfg.request_timeout_s))
        await self.register()

    async def close(self, status: str) -> None:
        if self.session is None:
            return
        try:
            if self.env_id is not None:
                await self._request("POST", "/disconnect-env", {"env_id": self.env_id})
        except TrainerAPIError as err:
            logger.warning("could not disconnect from the trainer API: %s", err)
        finally:
            await self.session.close()
            self.session = None

    async def _request(self, method: str, path: str, payload: Any = None) -> Any:
        """One JSON request, retried with exponential backoff on connection errors and 5xx."""
        assert self.session is not None
        delay = 0.5
        for attempt in range(1, self.cfg.max_attempts + 1):
            try:
                async with self.session.request(method, self.url + path, json=payload) as resp:
                    if resp.status < 500:
                        if resp.status >= 400:
                            raise TrainerAPIError(f"{method} {path}: HTTP {resp.status}: {(await resp.text())[:300]}")
                        return await resp.json()
                    cause = f"HTTP {resp.status}"
            except (aiohttp.ClientError, asyncio.TimeoutError) as err:
                cause = f"{type(err).__name__}: {err}"
            if attempt == self.cfg.max_attempts:
                break
            logger.warning("trainer API %s %s failed (%s), attempt %d/%d; retrying in %.1f s", method, path, cause, attempt, self.cfg.max_attempts, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)
        raise TrainerAPIError(f"{method} {self.url}{path} failed {self.cfg.max_attempts} times; last: {cause}")

    async def register(self) -> None:
        deadline = time.monotonic() + self.cfg.wait_timeout_s
        body = {"max_token_length": self.max_token_length, "desired_name": self.cfg.env_name, "weight": self.cfg.weight, "group_size": self.group_size}
        while True:
            answer = await self._request("POST", "/register-env", body)
            if answer.get("status") == "success":
                self.env_id = int(answer["env_id"])
                break
            if time.monotonic() > deadline:
                raise TrainerAPIError(f"the trainer at {self.url} did not start within serve.wait_timeout_s={self.cfg.wait_timeout_s} s (last answer: {answer})")
            await asyncio.sleep(self.cfg.poll_interval_s)
        info = await self._request("GET", "/info")
        self.batch_size = int(info.get("batch_size", -1))
        logger.info("registered with the trainer API %s as env %d (%s); trainer batch size %d", self.url, self.env_id, answer.get("wandb_name"), self.batch_size)

    async def _wait_for_room(self) -> None:
        """Back-pressure: wait while max_batches_offpolicy batches are already queued."""
        if self.batch_size <= 0:
            return
        limit = self.cfg.max_batches_offpolicy * self.batch_size
        started = time.monotonic()
        while True:
            status = await self._request("GET", "/status-env", {"env_id": self.env_id})
            queued = int(status.get("queue_size", 0)) * self.group_size
            if queued < limit:
                break
            if time.monotonic() - started > self.cfg.wait_timeout_s:
                raise TrainerAPIError(f"the trainer took no batch for serve.wait_timeout_s={self.cfg.wait_timeout_s} s ({queued} sequences queued, limit {limit})")
            await asyncio.sleep(self.cfg.poll_interval_s)
        self.waited_s += time.monotonic() - started

    async def write(self, written: Written) -> None:
        """Send one written group (with this env's id), after waiting for room in the queue."""
        await self._wait_for_room()
        await self._request("POST", "/scored_data", {**written.group, "env_id": self.env_id})
        self.sent += 1

    def summary(self) -> dict[str, float]:
        return {"summary/serve_groups_sent": float(self.sent), "summary/serve_wait_s": self.waited_s}
