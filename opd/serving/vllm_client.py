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
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
from atroposlib.envs.server_handling.server_baseline import APIServer, APIServerConfig
from openai.types.chat import ChatCompletion
from openai.types.completion import Completion

logger = logging.getLogger(__name__)


class ServerRequestError(RuntimeError):
    """A request to the inference server failed; the message says where and why."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def normalise_topk_row(row: dict[str, Any] | None, actual: int, k: int) -> tuple[list[int], list[float], float | None]:
    """One vLLM prompt-logprob row -> (top-K ids, their logprobs, the actual token's logprob).

    vLLM returns K entries when the actual token is in the top K, else K+1 with the actual token
    added; rows are keyed by token id strings. The result is sorted by logprob (descending, ties
    by id) and cut to K.
    """
    if not row:
        return [], [], None
    entries = sorted(((int(tid), float(e["logprob"])) for tid, e in row.items()), key=lambda p: (-p[1], p[0]))
    actual_lp = next((lp for tid, lp in entries if tid == actual), None)
    top = entries[:k]
    return [tid for tid, _ in top], [lp for _, lp in top], actual_lp


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

    async def _post(self, route: str, payload: dict[str, Any]) -> dict[str, Any]:
        url = f"{self.base_url}{route}"
        try:
            async with self._client().post(url, json=payload) as response:
                if response.status != 200:
                    self.request_errors += 1
                    body = (await response.text())[:500]
                    raise ServerRequestError(f"POST {url} answered HTTP {response.status}: {body}", response.status)
                return await response.json()
        except asyncio.TimeoutError:
            self.request_errors += 1
            raise ServerRequestError(f"POST {url} timed out after {self.config.timeout} s") from None
        except aiohttp.ClientError as err:
            self.request_errors += 1
            raise ServerRequestError(f"POST {url} failed: {type(err).__name__}: {err}") from None

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

        Position 0 has no row (nothing precedes it): empty lists and None.
        """
        prompt = kwargs.pop("input_ids", None)
        top_k = int(kwargs.pop("top_k", kwargs.pop("prompt_logprobs", 1)))
        if prompt is None:
            raise ValueError("get_logprobs needs input_ids")
        payload = {
            "model": kwargs.get("model", self.config.model_name),
            "prompt": list(prompt),
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": top_k,
        }
        data = await self._post("/completions", payload)
        rows = data["choices"][0].get("prompt_logprobs")
        if rows is None or len(rows) != len(prompt):
            raise ServerRequestError(f"{self.base_url}/completions returned {0 if rows is None else len(rows)} prompt-logprob rows for {len(prompt)} tokens")
        top_ids, top_lps, actual = [], [], []
        for token, row in zip(prompt, rows):
            ids, lps, lp = normalise_topk_row(row, int(token), top_k)
            top_ids.append(ids)
            top_lps.append(lps)
            actual.append(lp)
        return {
            "prompt_tokens": list(prompt),
            "prompt_topk_token_ids": top_ids,
            "prompt_topk_logprobs": top_lps,
            "prompt_token_logprobs": actual,
        }
