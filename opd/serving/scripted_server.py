"""A scripted OpenAI/vLLM-compatible server on loopback with a fixed latency per request (no model).

`python -m opd.serving.scripted_server --port P --latency 0.1 --tokenizer DIR` serves:
- `POST /v1/completions`: generation from token ids (a fixed answer, or for a coding agent a tool
  call per turn) with `token_ids` + logprobs, or prompt-logprob scoring (`prompt_logprobs: K`);
- `POST /v1/chat/completions`: `n` judge votes, each a positive verdict with a hint;
- `GET /health`, `GET /stats` (requests served, most in flight at once, time of the first
  request) and `POST /reset`.
It runs in its own process so its CPU time is not the framework's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from typing import Any

from aiohttp import web

logger = logging.getLogger(__name__)

MATH_ANSWER = "I add them.</think>The answer is \\boxed{4}.<|im_end|>"
TOOL_TURN = '<tool_call>\n{"name": "terminal", "arguments": {"command": "echo ok"}}\n</tool_call><|im_end|>'
VOTE = "The output shows a failure.\n\\boxed{1}\n[HINT_START]Check the function name against the task before running the tests.[HINT_END]"


class ScriptedServer:
    def __init__(self, latency_s: float, tokenizer: Any, fail_every: int = 0) -> None:
        self.latency_s = latency_s
        # Answer every n-th request with HTTP 503 (0: never), to test retries.
        self.fail_every = fail_every
        self.tokenizer = tokenizer
        self.im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
        self.answer_ids = tokenizer.encode(MATH_ANSWER, add_special_tokens=False)
        self.tool_ids = tokenizer.encode(TOOL_TURN, add_special_tokens=False)
        # Agent or not, per prompt head (decoding 600 tokens per request would cost the server more
        # than the framework it measures).
        self._agent_by_head: dict[tuple[int, ...], bool] = {}
        # Encoded answers: generation bodies by agent-or-not, scoring rows by (token, K).
        self._generation_body: dict[bool, bytes] = {}
        self._row_json: dict[tuple[int, int], bytes] = {}
        self.served = 0
        self.in_flight = 0
        self.most_in_flight = 0
        self.first_request_at: float | None = None

    async def _timed(self) -> None:
        if self.first_request_at is None:
            self.first_request_at = time.time()
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.latency_s)
        finally:
            self.in_flight -= 1
            self.served += 1

    async def completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        await self._timed()
        if self.fail_every and self.served % self.fail_every == 0:
            return web.json_response({"error": "scripted overload"}, status=503)
        prompt = body["prompt"]
        if body.get("prompt_logprobs"):
            return self._scoring(prompt, int(body["prompt_logprobs"]))
        agent = self._is_agent(prompt)
        cached = self._generation_body.get(agent)
        if cached is None:
            ids = self.tool_ids if agent else self.answer_ids
            choice = {"index": 0, "text": "", "token_ids": ids, "finish_reason": "stop", "logprobs": {"token_logprobs": [-0.5] * len(ids)}}
            cached = self._generation_body[agent] = json.dumps({"id": "cmpl", "object": "text_completion", "created": 0, "model": "loopback", "choices": [choice]}).encode()
        return web.Response(body=cached, content_type="application/json")

    def _scoring(self, prompt: list[int], k: int) -> web.Response:
        """Prompt-logprob rows like vLLM's (K entries per position, none for the first), built from
        per-token JSON fragments cached by (token, K): a real server computes them in parallel,
        the scripted one must not become the bottleneck of the benchmark."""
        fragments = []
        for token in prompt[1:]:
            fragment = self._row_json.get((token, k))
            if fragment is None:
                # The prompt's own token first, as vLLM always returns the actual token's logprob.
                row = {str(token if j == 0 else (token + j) % 4000): {"logprob": round(-0.1 * (j + 1), 6), "rank": j + 1} for j in range(k)}
                fragment = self._row_json[(token, k)] = json.dumps(row).encode()
            fragments.append(fragment)
        body = (b'{"id":"cmpl","object":"text_completion","created":0,"model":"loopback","choices":[{"index":0,"text":"","token_ids":[0],'
                b'"finish_reason":"length","logprobs":null,"prompt_logprobs":[null' + b"".join(b"," + f for f in fragments) + b"]}]}")
        return web.Response(body=body, content_type="application/json")

    def _is_agent(self, prompt: list[int]) -> bool:
        """A coding-agent prompt (its tools include `terminal`): answered with a tool call per turn."""
        head = tuple(prompt[:600])
        agent = self._agent_by_head.get(head)
        if agent is None:
            agent = self._agent_by_head[head] = '"terminal"' in self.tokenizer.decode(head)
        return agent

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        await self._timed()
        choices = [{"index": i, "finish_reason": "stop", "message": {"role": "assistant", "content": VOTE}} for i in range(int(body.get("n", 1)))]
        return web.json_response({"id": "chat", "object": "chat.completion", "created": int(time.time()), "model": body.get("model", "m"), "choices": choices})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response({"served": self.served, "most_in_flight": self.most_in_flight, "in_flight": self.in_flight, "first_request_at": self.first_request_at})

    async def reset(self, request: web.Request) -> web.Response:
        self.served = self.most_in_flight = 0
        self.first_request_at = None
        return web.json_response({"ok": True})

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/health", self.health)
        app.router.add_get("/stats", self.stats)
        app.router.add_post("/reset", self.reset)
        return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--fail-every", type=int, default=0, help="answer every n-th completion with HTTP 503")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from opd.event_loop import loop_factory

    server = ScriptedServer(args.latency, AutoTokenizer.from_pretrained(args.tokenizer), args.fail_every)
    web.run_app(server.app(), host="127.0.0.1", port=args.port, print=None, access_log=None, backlog=4096, loop=(loop_factory() or asyncio.new_event_loop)())


if __name__ == "__main__":
    main()
