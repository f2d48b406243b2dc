"""A client of one stock vLLM OpenAI server (`/v1/completions`, `/v1/chat/completions`).

- `generate(prompt_ids, ...)`: generation from token ids (never re-tokenised text); the sampled
  ids and their logprobs (vLLM's `return_token_ids` + `logprobs: 0`).
- `score(prompt_ids, top_k, rows_from)`: prompt-logprob scoring; every position's top-K row is
  normalised to exactly K entries sorted by logprob, and the actual token's logprob is kept.
- `chat(messages, n=...)`: the text of `n` chat completions (the judge's votes).

One attempt per call: a failure raises `ServerRequestError` naming the URL, the status and the
server's message, and says whether trying again may help (`retryable`). Slots and retries are the
pool's (`opd.serving.pool`). Bodies go through msgspec; prompt-logprob answers decode straight into
small typed structs (at K=20 a scoring answer is ~20 entries per token, and `json` spent most of
the OPD stage's client CPU on them).

Idle connections: a pooled connection is reused for at most `keepalive_s` seconds of idleness,
which must stay below the server's own idle timeout (vLLM closes an idle connection after 5 s,
`VLLM_HTTP_TIMEOUT_KEEP_ALIVE`); a request written into a connection the server has closed fails
("Can not write request body", "Server disconnected"). The server's close can still cross the
next request (an event loop busy when it arrives, a proxy that closes sooner): a request that fails
so on a reused connection, before any answer came, is sent again at once on a new connection,
without backoff, and counted in `reconnects`, not in `request_errors`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec
import numpy as np

logger = logging.getLogger(__name__)


class ServerRequestError(RuntimeError):
    """A request to the inference server failed; the message says where and why."""

    def __init__(self, message: str, status: int | None = None, retryable: bool | None = None) -> None:
        super().__init__(message)
        self.status = status
        # Connection errors, timeouts, 5xx and garbled bodies may pass; a 4xx will not.
        self.retryable = retryable if retryable is not None else status is None or status >= 500


@dataclass(frozen=True)
class Generation:
    """One sampled continuation: the ids vLLM sampled, their logprobs and why it stopped."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str


@dataclass(frozen=True)
class ChatReply:
    """One chat completion: its text and why it ended (`stop`; `length` when cut at max_tokens)."""

    text: str
    finish_reason: str


@dataclass(frozen=True)
class PromptScores:
    """Per prompt position: the top-K ids and logprobs (sorted) and the actual token's logprob.

    Position 0 has no row (nothing precedes it), nor do positions before `rows_from`: empty
    lists and None there."""

    top_ids: list[list[int]]
    top_logprobs: list[list[float]]
    token_logprobs: list[float | None]


class _Entry(msgspec.Struct):
    logprob: float


class _ScoringChoice(msgspec.Struct):
    # Token id -> entry (vLLM keys rows by the id as a string; msgspec converts).
    prompt_logprobs: list[dict[int, _Entry] | None] | None = None


class _ScoringAnswer(msgspec.Struct):
    """The part of a `/v1/completions` answer with `prompt_logprobs` that scoring reads."""

    choices: list[_ScoringChoice]


class _Logprobs(msgspec.Struct):
    token_logprobs: list[float] | None = None


class _GenerationChoice(msgspec.Struct):
    index: int = 0
    token_ids: list[int] | None = None
    logprobs: _Logprobs | None = None
    finish_reason: str | None = None


class _GenerationAnswer(msgspec.Struct):
    choices: list[_GenerationChoice]


class _Message(msgspec.Struct):
    content: str | None = None


class _ChatChoice(msgspec.Struct):
    message: _Message
    index: int = 0
    finish_reason: str | None = None


class _ChatAnswer(msgspec.Struct):
    choices: list[_ChatChoice]


_JSON = {"Content-Type": "application/json"}
# How a request fails when the connection it was written into had been closed by the server
# (not ClientConnectorError, a ClientOSError too: a connection that could not be made).
_CLOSED_UNDER_IT = (aiohttp.ServerDisconnectedError, aiohttp.ClientConnectionResetError, aiohttp.ClientOSError)


async def _on_reuse(session: aiohttp.ClientSession, context: Any, params: Any) -> None:
    """Note on the request's own context that it went out on a pooled connection."""
    if isinstance(context.trace_request_ctx, dict):
        context.trace_request_ctx["reused"] = True


_REUSE = aiohttp.TraceConfig()
_REUSE.on_connection_reuseconn.append(_on_reuse)
_REUSE.freeze()


def _decode(body: bytes, into: Any = None) -> Any:
    """The answer parsed (into the msgspec type `into`, if given). Raises ValueError when it is not
    JSON, msgspec.ValidationError (a ValueError too) when it is JSON of another shape."""
    try:
        return msgspec.json.decode(body, type=into or Any)
    except msgspec.DecodeError:
        # Not strict JSON (e.g. a bare -Infinity) or not the expected shape: the standard parser,
        # then the same typed conversion (which names the field that does not fit).
        parsed = json.loads(body)
        return parsed if into is None else msgspec.convert(parsed, into, strict=False)


def normalise_topk_rows(tokens: list[int], rows: list[dict[Any, Any] | None], k: int) -> tuple[list[list[int]], list[list[float]], list[float | None]]:
    """vLLM prompt-logprob rows -> per position (top-K ids, their logprobs, the actual token's logprob).

    vLLM returns K entries when the actual token is in the top K, else K+1 with the actual token
    added; rows are keyed by token id (strings in JSON). Each result row is sorted by logprob
    (descending, ties by id) and cut to K; an empty or missing row gives [], [], None. One numpy
    sort of all entries instead of a Python sort per row (1k rows x K=20: 15 vs 26 ms)."""
    lengths = np.fromiter((len(row) if row else 0 for row in rows), dtype=np.int64, count=len(rows))
    ids: list[int] = []
    lps: list[float] = []
    for row in rows:
        if row:
            ids.extend(row.keys())
            lps.extend([entry.logprob if isinstance(entry, _Entry) else entry["logprob"] for entry in row.values()])
    flat_ids = np.array(ids, dtype=np.int64)
    flat_lps = np.array(lps, dtype=np.float64)
    row_of = np.repeat(np.arange(len(rows)), lengths)
    order = np.lexsort((flat_ids, -flat_lps, row_of))  # by row, then logprob descending, then id
    starts = np.cumsum(lengths) - lengths
    keep = (np.arange(len(flat_ids)) - np.repeat(starts, lengths)) < k
    kept_ids, kept_lps = flat_ids[order][keep], flat_lps[order][keep]
    kept = np.minimum(lengths, k)
    bounds = np.cumsum(kept)[:-1]
    top_ids = [chunk.tolist() for chunk in np.split(kept_ids, bounds)] if len(rows) else []
    top_lps = [chunk.tolist() for chunk in np.split(kept_lps, bounds)] if len(rows) else []
    is_actual = flat_ids == np.repeat(np.asarray(tokens, dtype=np.int64), lengths)
    actual: list[float | None] = [None] * len(rows)
    for position, lp in zip(row_of[is_actual].tolist(), flat_lps[is_actual].tolist()):
        actual[position] = lp
    return top_ids, top_lps, actual


class VLLMClient:
    """One vLLM server's `/v1` routes; see the module docstring."""

    def __init__(self, base_url: str, model: str, api_key: str = "opd-local", timeout_s: float = 120.0, keepalive_s: float = 3.0) -> None:
        base = (base_url or "").rstrip("/")
        if not base:
            raise ValueError("VLLMClient needs a base_url such as http://127.0.0.1:8000/v1")
        self.base_url = base
        self.model = model
        self.api_key = api_key
        self.timeout_s = timeout_s
        # Seconds an idle pooled connection is reused for (below the server's idle timeout).
        self.keepalive_s = keepalive_s
        self._session: aiohttp.ClientSession | None = None
        # Requests sent again on a new connection after a pooled one had been closed by the server.
        self._fresh: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None
        # Requests that failed (HTTP error, timeout, connection, malformed answer), and the last one's message.
        self.request_errors = 0
        self.last_error: str | None = None
        # Requests sent again at once on a new connection: the pooled one had been closed by the server.
        self.reconnects = 0

    def _sessions(self) -> tuple[aiohttp.ClientSession, aiohttp.ClientSession]:
        """(the pooled session, the one whose every request opens a connection of its own)."""
        # A session belongs to one event loop; a new loop (another asyncio.run) gets new ones.
        if self._session_loop is not asyncio.get_running_loop():
            self._session = self._fresh = None
        self._session_loop = asyncio.get_running_loop()
        timeout, headers = aiohttp.ClientTimeout(total=self.timeout_s), {"Authorization": f"Bearer {self.api_key}"}
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=timeout, headers=headers, trace_configs=[_REUSE],
                                                  connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=self.keepalive_s))
        if self._fresh is None or self._fresh.closed:
            self._fresh = aiohttp.ClientSession(timeout=timeout, headers=headers, connector=aiohttp.TCPConnector(limit=0, force_close=True))
        return self._session, self._fresh

    async def close(self) -> None:
        for session in (self._session, self._fresh):
            if session is not None:
                await session.close()
        self._session = self._fresh = None

    def _failed(self, error: ServerRequestError) -> ServerRequestError:
        """Count `error` (and keep its message) before it is raised."""
        self.request_errors += 1
        self.last_error = str(error)[:300]
        return error

    async def _post(self, route: str, payload: dict[str, Any], into: Any) -> Any:
        """POST `payload`; the answer decoded into the msgspec type `into`. Sent again at once on a
        new connection when the pooled one it went out on had been closed by the server."""
        url = f"{self.base_url}{route}"
        body = msgspec.json.encode(payload)
        pooled, fresh = self._sessions()
        try:
            sent: dict[str, bool] = {"reused": False}
            try:
                raw = await self._send(pooled, url, body, sent)
            except _CLOSED_UNDER_IT as err:
                if not sent["reused"] or isinstance(err, aiohttp.ClientConnectorError):
                    raise
                self.reconnects += 1
                logger.debug("POST %s: the pooled connection had been closed by the server (%s: %s); sent again on a new one", url, type(err).__name__, err)
                raw = await self._send(fresh, url, body, None)
        except asyncio.TimeoutError:
            raise self._failed(ServerRequestError(f"POST {url} timed out after {self.timeout_s:g} s")) from None
        except aiohttp.ClientError as err:
            raise self._failed(ServerRequestError(f"POST {url} failed: {type(err).__name__}: {err}")) from None
        except ServerRequestError as err:
            raise self._failed(err)
        try:
            return _decode(raw, into)
        except msgspec.ValidationError as err:
            raise self._failed(ServerRequestError(f"POST {url} returned an unexpected answer: {err}; {raw[:200]!r}")) from None
        except ValueError as err:
            raise self._failed(ServerRequestError(f"POST {url} answered with a body that is not JSON: {err}; {raw[:200]!r}")) from None

    @staticmethod
    async def _send(session: aiohttp.ClientSession, url: str, body: bytes, context: dict[str, bool] | None) -> bytes:
        """One POST of `body`; its answer's bytes (a status other than 200 raises)."""
        async with session.post(url, data=body, headers=_JSON, trace_request_ctx=context) as response:
            if response.status != 200:
                text = (await response.text())[:500]
                raise ServerRequestError(f"POST {url} answered HTTP {response.status}: {text}", response.status)
            return await response.read()

    async def generate(self, prompt_ids: list[int], *, max_tokens: int, temperature: float, top_p: float | None = None,
                       top_k: int | None = None, min_p: float | None = None, stop: list[str] | None = None, n: int = 1,
                       seed: int | None = None) -> list[Generation]:
        """`n` continuations of `prompt_ids`, in choice order. A sampling field left None is not
        sent: the server's default for the model (its generation_config.json) applies. `seed`:
        vLLM's per-request seed (the same seed, prompt and weights sample the same tokens; None:
        the server's own randomness)."""
        payload: dict[str, Any] = {
            "model": self.model, "prompt": list(prompt_ids), "max_tokens": max_tokens, "temperature": temperature,
            "n": n, "logprobs": 0, "return_token_ids": True, "skip_special_tokens": False,
        }
        payload.update({k: v for k, v in (("top_p", top_p), ("top_k", top_k), ("min_p", min_p)) if v is not None})
        if stop:
            payload["stop"] = stop
        if seed is not None:
            payload["seed"] = seed
        answer: _GenerationAnswer = await self._post("/completions", payload, _GenerationAnswer)
        out = []
        for choice in sorted(answer.choices, key=lambda c: c.index):
            ids = choice.token_ids
            lps = choice.logprobs.token_logprobs if choice.logprobs else None
            if ids is None or lps is None or len(ids) != len(lps):
                raise self._failed(ServerRequestError(
                    f"{self.base_url}/completions returned no token ids/logprobs aligned with each other "
                    "(is this a vLLM server that supports return_token_ids?)", retryable=False,
                ))
            out.append(Generation(list(ids), [float(lp) for lp in lps], choice.finish_reason or "unknown"))
        if len(out) != n:
            raise self._failed(ServerRequestError(f"{self.base_url}/completions returned {len(out)} choices for n={n}"))
        return out

    async def score(self, prompt_ids: list[int], top_k: int, rows_from: int = 0) -> PromptScores:
        """The prompt's top-K rows and actual-token logprobs; rows before `rows_from` come back
        empty (teacher scoring reads only the student's turn, not the hint-conditioned context)."""
        payload = {"model": self.model, "prompt": list(prompt_ids), "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": top_k}
        answer: _ScoringAnswer = await self._post("/completions", payload, _ScoringAnswer)
        rows = answer.choices[0].prompt_logprobs if answer.choices else None
        if rows is None or len(rows) != len(prompt_ids):
            raise self._failed(ServerRequestError(f"{self.base_url}/completions returned {0 if rows is None else len(rows)} prompt-logprob rows for {len(prompt_ids)} tokens"))
        skipped = min(max(0, rows_from), len(rows))
        top_ids, top_lps, actual = normalise_topk_rows(list(prompt_ids[skipped:]), rows[skipped:], top_k)
        return PromptScores([[] for _ in range(skipped)] + top_ids, [[] for _ in range(skipped)] + top_lps, [None] * skipped + actual)

    async def chat(self, messages: list[dict[str, Any]], *, n: int, max_tokens: int, temperature: float, **extra: Any) -> list[ChatReply]:
        """`n` chat completions, in order (`extra`: more request fields, e.g. chat_template_kwargs)."""
        payload = {"model": self.model, "messages": messages, "n": n, "max_tokens": max_tokens, "temperature": temperature, **extra}
        answer: _ChatAnswer = await self._post("/chat/completions", payload, _ChatAnswer)
        return [ChatReply(choice.message.content or "", choice.finish_reason or "unknown") for choice in sorted(answer.choices, key=lambda c: c.index)]
