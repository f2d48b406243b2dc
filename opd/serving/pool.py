"""Request slots over one or more inference servers, with bounded retries.

Every request (rollout generation, judge votes, teacher scoring, evaluation) takes one of its
server's `slots` (`server.max_requests_in_flight`): no path can exceed that limit. A request that
finds every slot busy waits, first come first served, to be woken by the next release (never by
polling), then goes to the server with the most free slots. A failure that may pass (connection,
timeout, 5xx, garbled answer) is retried up to `max_attempts` in all, with exponential backoff and
its slot released while it waits; the last failure is raised as it is (`ServerRequestError`).
Failed requests are warned about as they happen, at most one line per `warn_every_s` seconds
(the lines between are counted into the next one).

What happened to the requests is counted apart (`RequestCounts`, the run's `summary/server_*`):
requests that failed for good (their last attempt failed), attempts retried after a backoff,
requests cut off by the run's own end (cancelled, or failing once the pool is closing), and
requests a client sent again at once on a new connection because the pooled one had been closed
by the server (`VLLMClient.reconnects`: not a failure).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from dataclasses import dataclass, fields
from typing import Any, Awaitable, Callable, Protocol, TypeVar

from opd.latency import phase
from opd.serving.vllm_client import ChatReply, Generation, PromptScores, ServerRequestError

logger = logging.getLogger(__name__)
T = TypeVar("T")


class InferenceClient(Protocol):
    """What a server client offers (`VLLMClient`, or a scripted double in tests)."""

    base_url: str
    request_errors: int

    async def generate(self, prompt_ids: list[int], *, max_tokens: int, temperature: float, top_p: float | None = None,
                       top_k: int | None = None, min_p: float | None = None, stop: list[str] | None = None, n: int = 1,
                       seed: int | None = None) -> list[Generation]: ...

    async def score(self, prompt_ids: list[int], top_k: int, rows_from: int = 0) -> PromptScores: ...

    async def chat(self, messages: list[dict[str, Any]], *, n: int, max_tokens: int, temperature: float, **extra: Any) -> list[ChatReply]: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class RequestCounts:
    """What happened to the requests of one or more pools (`+` adds them up)."""

    # Requests that failed for good: their last attempt failed, or a failure that cannot pass.
    failed: int = 0
    # Failed attempts that were tried again after a backoff (a request that then succeeded is
    # not in `failed`).
    retries: int = 0
    # Requests cut off by the run's own end: cancelled, or failing once the pool was closing.
    cancelled: int = 0
    # Requests sent again at once on a new connection, the pooled one closed by the server under it.
    reconnects: int = 0

    def __add__(self, other: "RequestCounts") -> "RequestCounts":
        return RequestCounts(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))


class FailureWarnings:
    """A warning per failed request, at most one per `every_s` seconds: the first at once, the
    ones in between counted into the next line."""

    def __init__(self, every_s: float = 30.0) -> None:
        self.every_s = every_s
        self.last: float | None = None
        self.unsaid = 0

    def failed(self, err: BaseException, what_next: str) -> None:
        now = time.monotonic()
        if self.last is not None and now - self.last < self.every_s:
            self.unsaid += 1
            return
        more = f"; {self.unsaid} more failed since the last such warning" if self.unsaid else ""
        logger.warning("inference request failed, %s: %s%s", what_next, str(err)[:300], more)
        self.last, self.unsaid = now, 0


class ServerPool:
    """Slots and retries over `clients`; offers the clients' calls (see the module docstring)."""

    def __init__(self, clients: list[InferenceClient], slots: int, max_attempts: int = 3, backoff_s: float = 0.5, max_backoff_s: float = 10.0) -> None:
        if not clients or slots < 1 or max_attempts < 1:
            raise ValueError(f"ServerPool needs clients, slots >= 1 and max_attempts >= 1 (got {len(clients)}, {slots}, {max_attempts})")
        self.clients = list(clients)
        self.slots = slots
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.free = [slots] * len(clients)
        self.in_use_most = 0
        # See RequestCounts.
        self.failed = self.retries = self.cancelled = 0
        # Set by close(): a request failing from then on was cut off by the run's end.
        self.closing = False
        self.warnings = FailureWarnings()
        self._waiting: deque[asyncio.Future[int]] = deque()

    @property
    def counts(self) -> RequestCounts:
        return RequestCounts(self.failed, self.retries, self.cancelled, sum(getattr(client, "reconnects", 0) for client in self.clients))

    @property
    def request_errors(self) -> int:
        """Requests that failed for good (after their retries)."""
        return self.failed

    @property
    def in_use(self) -> int:
        """Requests that hold a server slot now (sent, or about to be)."""
        return self.slots * len(self.free) - sum(self.free)

    @property
    def waiting(self) -> int:
        """Requests waiting for a free slot now."""
        return len(self._waiting)

    @property
    def last_error(self) -> str | None:
        """A failed request's message (the last one of the first client that has one)."""
        return next((error for client in self.clients if (error := getattr(client, "last_error", None))), None)

    async def _acquire(self) -> int:
        """Index of the server whose slot this request now holds.

        Invariant: a slot is free only while nobody waits (a release hands its slot straight to
        the first waiter), so waiting is first come, first served."""
        if not self._waiting:
            best = max(range(len(self.free)), key=self.free.__getitem__)
            if self.free[best] > 0:
                self.free[best] -= 1
                self.in_use_most = max(self.in_use_most, self.slots * len(self.free) - sum(self.free))
                return best
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release(waiter.result())  # a slot handed to a request that no longer wants it
            raise

    def _release(self, index: int) -> None:
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(index)
                return
        self.free[index] += 1

    async def call(self, request: Callable[[InferenceClient], Awaitable[T]]) -> T:
        """Run `request` against a server with a free slot, retrying failures that may pass."""
        try:
            return await self._attempts(request)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    async def _attempts(self, request: Callable[[InferenceClient], Awaitable[T]]) -> T:
        for attempt in range(1, self.max_attempts + 1):
            with phase("slot"):
                index = await self._acquire()
            try:
                with phase("request"):
                    return await request(self.clients[index])
            except ServerRequestError as err:
                if self.closing:  # the run is ending: cut off, not failed
                    self.cancelled += 1
                    raise
                if not err.retryable or attempt == self.max_attempts:
                    self.failed += 1
                    self.warnings.failed(err, f"given up after attempt {attempt}/{self.max_attempts}")
                    raise
                self.warnings.failed(err, f"retrying (attempt {attempt}/{self.max_attempts})")
                cause = err
            finally:
                self._release(index)
            self.retries += 1
            delay = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
            logger.debug("request failed (attempt %d/%d), retrying in %.2f s: %s", attempt, self.max_attempts, delay, cause)
            with phase("backoff"):
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def generate(self, prompt_ids: list[int], **kwargs: Any) -> list[Generation]:
        return await self.call(lambda client: client.generate(prompt_ids, **kwargs))

    async def score(self, prompt_ids: list[int], top_k: int, rows_from: int = 0) -> PromptScores:
        return await self.call(lambda client: client.score(prompt_ids, top_k, rows_from))

    async def chat(self, messages: list[dict[str, Any]], **kwargs: Any) -> list[ChatReply]:
        return await self.call(lambda client: client.chat(messages, **kwargs))

    async def close(self) -> None:
        self.closing = True
        for client in self.clients:
            await client.close()
