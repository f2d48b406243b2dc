"""An atroposlib `APIServer` over stock vLLM's OpenAI routes (`/v1/completions`, `/v1/chat/completions`).

atroposlib's own `VLLMServer` needs a `/generate` route that stock vLLM lacks. This class gives
the same contract through `/v1`:

- `tokens_and_logprobs_completion(input_ids=[...], ...)`: generation from token ids; returns the
  sampled ids and their logprobs (vLLM's `return_token_ids` + `logprobs: 0`).
- `get_logprobs(input_ids=[...], top_k=K)`: prompt-logprob scoring; every position's top-K row
  is normalised to exactly K entries sorted by logprob, and the logprob of the actual token is
  kept separately (`prompt_token_logprobs`).

Errors name the URL, the HTTP status and the server's message. Requests are bounded by
`APIServerConfig.timeout`; atroposlib's wrapper retries each call (3 attempts, with backoff).
Bodies are encoded and decoded with msgspec (prompt-logprob answers straight into small typed
structs): at K=20 a scoring answer is ~20 entries per token, and `json` spent most of the OPD
stage's client CPU on them.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import aiohttp
import msgspec
import numpy as np
from atroposlib.envs.server_handling.server_baseline import APIServer, APIServerConfig
from openai.types.chat import ChatCompletion
from openai.types.completion import Completion

logger = logging.getLogger(__name__)


class ServerRequestError(RuntimeError):
    """A request to the inference server failed; the message says where and why."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class _Entry(msgspec.Struct):
    logprob: float


class _ScoringChoice(msgspec.Struct):
    # Token id -> entry (vLLM keys rows by the id as a string; msgspec converts).
    prompt_logprobs: list[dict[int, _Entry] | None] | None = None


class _ScoringAnswer(msgspec.Struct):
    """The part of a `/v1/completions` answer with `prompt_logprobs` that scoring reads."""

    choices: list[_ScoringChoice]


_JSON = {"Content-Type": "application/json"}


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


class OpenAIVLLMServer(APIServer):
    """atroposlib server class for stock vLLM; forced on an env via `server_cls`."""

    def __init__(self, config: APIServerConfig, reasoning_config: Any = None) -> None:
        super().__init__(config, reasoning_config=reasoning_config)
        base = (config.base_url or "").rstrip("/")
        if not base:
            raise ValueError("OpenAIVLLMServer needs a base_url such as http://127.0.0.1:8000/v1")
        self.base_url = base
        self.root_url = base[: -len("/v1")] if base.endswith("/v1") else base
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None
        # Requests that failed (HTTP error, timeout, connection); atroposlib retries each call.
        self.request_errors = 0

    def _client(self) -> aiohttp.ClientSession:
        # A session belongs to one event loop; a new loop (another asyncio.run) gets a new one.
        if self._session is not None and self._session_loop is not asyncio.get_running_loop():
            self._session = None
        if self._session is None or self._session.closed:
            self._session_loop = asyncio.get_running_loop()
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.config.timeout),
                connector=aiohttp.TCPConnector(limit=0),
                headers={"Authorization": f"Bearer {self.config.api_key}"},
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _post(self, route: str, payload: dict[str, Any], into: Any = None) -> Any:
        """POST `payload`; the answer decoded (into the msgspec type `into`, if given)."""
        url = f"{self.base_url}{route}"
        try:
            async with self._client().post(url, data=msgspec.json.encode(payload), headers=_JSON) as response:
                if response.status != 200:
                    self.request_errors += 1
                    body = (await response.text())[:500]
                    raise ServerRequestError(f"POST {url} answered HTTP {response.status}: {body}", response.status)
                raw = await response.read()
        except asyncio.TimeoutError:
            self.request_errors += 1
            raise ServerRequestError(f"POST {url} timed out after {self.config.timeout} s") from None
        except aiohttp.ClientError as err:
            self.request_errors += 1
            raise ServerRequestError(f"POST {url} failed: {type(err).__name__}: {err}") from None
        try:
            return _decode(raw, into)
        except msgspec.ValidationError as err:
            self.request_errors += 1
            raise ServerRequestError(f"POST {url} returned an unexpected answer: {err}; {raw[:200]!r}") from None
        except ValueError as err:
            self.request_errors += 1
            raise ServerRequestError(f"POST {url} answered with a body that is not JSON: {err}; {raw[:200]!r}") from None

    async def check_server_status_task(self, chat_completion: bool = True) -> None:
        """Never mark the server unhealthy: atroposlib would then wait forever before each request.

        A dead server instead fails requests fast (connection refused), which the caller counts,
        retries with backoff and finally reports.
        """
        self.server_healthy = True

    async def chat_completion(self, **kwargs: Any) -> ChatCompletion:
        """atroposlib 0.4.0 retries `chat_completion` twice over (3 x 3 attempts, with backoff);
        keep only the inner retry, as for every other call."""
        return await APIServer.chat_completion.__wrapped__(self, **kwargs)  # type: ignore[attr-defined]

    async def _completion_wrapper(self, **kwargs: Any) -> Completion:
        return Completion.model_validate(await self._post("/completions", kwargs))

    async def _chat_completion_wrapper(self, **kwargs: Any) -> ChatCompletion:
        return ChatCompletion.model_validate(await self._post("/chat/completions", kwargs))

    async def _tokens_and_logprobs_completion_wrapper(self, **kwargs: Any) -> tuple[list, list, list, list]:
        """Generate from `input_ids`; (prompt ids, [sampled ids], [logprobs], [finish reasons]) per choice."""
        prompt = kwargs.pop("input_ids", None)
        if prompt is None:
            raise ValueError("tokens_and_logprobs_completion needs input_ids (token ids, never re-tokenised text)")
        kwargs.pop("prompt", None)
        if "max_new_tokens" in kwargs:
            kwargs["max_tokens"] = kwargs.pop("max_new_tokens")
        payload = {**kwargs, "prompt": list(prompt), "logprobs": 0, "return_token_ids": True}
        data = await self._post("/completions", payload)
        ids, logprobs, reasons = [], [], []
        for choice in sorted(data["choices"], key=lambda c: c["index"]):
            token_ids = choice.get("token_ids")
            token_lps = (choice.get("logprobs") or {}).get("token_logprobs")
            if token_ids is None or token_lps is None or len(token_ids) != len(token_lps):
                raise ServerRequestError(
                    f"{self.base_url}/completions returned no token ids/logprobs aligned with each other "
                    "(is this a vLLM server that supports return_token_ids?)"
                )
            ids.append([int(t) for t in token_ids])
            logprobs.append([float(lp) for lp in token_lps])
            reasons.append(choice.get("finish_reason") or "unknown")
        return list(prompt), ids, logprobs, reasons

    async def _get_logprobs_wrapper(self, **kwargs: Any) -> dict[str, Any]:
        """Score `input_ids`; per position the top-K ids/logprobs and the actual token's logprob.

        Position 0 has no row (nothing precedes it): empty lists and None. `rows_from=n` (ours):
        only positions >= n are normalised, earlier ones are returned empty like position 0
        (teacher scoring reads only the student's turn, not the hint-conditioned context).
        """
        prompt = kwargs.pop("input_ids", None)
        top_k = int(kwargs.pop("top_k", kwargs.pop("prompt_logprobs", 1)))
        rows_from = max(0, int(kwargs.pop("rows_from", 0)))
        if prompt is None:
            raise ValueError("get_logprobs needs input_ids")
        payload = {
            "model": kwargs.get("model", self.config.model_name),
            "prompt": list(prompt),
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": top_k,
        }
        data: _ScoringAnswer = await self._post("/completions", payload, into=_ScoringAnswer)
        rows = data.choices[0].prompt_logprobs if data.choices else None
        if rows is None or len(rows) != len(prompt):
            self.request_errors += 1
            raise ServerRequestError(f"{self.base_url}/completions returned {0 if rows is None else len(rows)} prompt-logprob rows for {len(prompt)} tokens")
        skipped = min(rows_from, len(rows))
        top_ids, top_lps, actual = normalise_topk_rows(list(prompt[skipped:]), rows[skipped:], top_k)
        if skipped:
            top_ids = [[] for _ in range(skipped)] + top_ids
            top_lps = [[] for _ in range(skipped)] + top_lps
            actual = [None] * skipped + actual
        return {
            "prompt_tokens": list(prompt),
            "prompt_topk_token_ids": top_ids,
            "prompt_topk_logprobs": top_lps,
            "prompt_token_logprobs": actual,
        }
