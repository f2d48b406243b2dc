"""Request slots (opd.serving.slots): one pool per server for every kind of request, FIFO
waiting without atroposlib's one-second polling, balanced over several servers; and the
batched prompt-logprob normalisation of the client."""

from __future__ import annotations

import asyncio
import random
import time

import pytest
from atroposlib.envs.server_handling import server_manager
from atroposlib.envs.server_handling.server_baseline import APIServerConfig, AsyncSemWithAdaptiveWeight
from openai.types.chat import ChatCompletion

from opd.loop import run_loop
from opd.runner import groups_to_fill
from opd.serving.slots import SlotServerManager
from opd.serving.vllm_client import OpenAIVLLMServer, normalise_topk_rows


class TimedServer(OpenAIVLLMServer):
    """An OpenAIVLLMServer whose requests take `latency` seconds (no HTTP); counts concurrency."""

    def __init__(self, config: APIServerConfig, latency: float) -> None:
        super().__init__(config)
        self.latency = latency
        self.running = 0
        self.most_running = 0
        self.served = 0

    async def _busy(self) -> None:
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            await asyncio.sleep(self.latency)
        finally:
            self.running -= 1
            self.served += 1

    async def _tokens_and_logprobs_completion_wrapper(self, **kwargs):
        await self._busy()
        return kwargs["input_ids"], [[7]], [[-0.5]], ["stop"]

    async def _chat_completion_wrapper(self, **kwargs):
        await self._busy()
        return ChatCompletion.model_validate({"id": "c", "object": "chat.completion", "created": 0, "model": "m",
                                              "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}]})

    async def _get_logprobs_wrapper(self, **kwargs):
        await self._busy()
        return {"prompt_tokens": kwargs["input_ids"], "prompt_topk_token_ids": [], "prompt_topk_logprobs": [], "prompt_token_logprobs": []}


def manager(latencies: list[float], slots: int, base: type = TimedServer) -> SlotServerManager:
    configs = [APIServerConfig(model_name="m", base_url=f"http://127.0.0.1:{9000 + i}/v1", api_key="x", timeout=30,
                               num_max_requests_at_once=slots, num_requests_for_eval=slots, server_type="vllm", health_check=False)
               for i in range(len(latencies))]
    latency_of = dict(zip((c.base_url for c in configs), latencies))

    class Server(base):
        def __init__(self, config: APIServerConfig, reasoning_config=None) -> None:
            super().__init__(config, latency_of[config.base_url])

    return SlotServerManager(configs, server_class=Server)


@pytest.fixture
def polls(monkeypatch) -> list[float]:
    """Sleeps of a second or more: atroposlib's wait_for_sem polls with asyncio.sleep(1) (the
    scripted servers' own latencies are shorter)."""
    seen: list[float] = []
    real_sleep = asyncio.sleep

    async def recording_sleep(delay: float, *args, **kwargs):
        if delay >= 1:
            seen.append(delay)
        return await real_sleep(delay, *args, **kwargs)

    monkeypatch.setattr(server_manager.asyncio, "sleep", recording_sleep)
    return seen


def test_oversubscribed_requests_queue_for_the_slots_without_polling(polls) -> None:
    servers = manager([0.05], slots=4)

    async def main() -> float:
        started = time.perf_counter()
        await asyncio.gather(*(servers.tokens_and_logprobs_completion(input_ids=[1, 2], max_tokens=1) for _ in range(16)))
        return time.perf_counter() - started

    wall = run_loop(main())
    (server,) = servers.servers
    assert server.served == 16 and server.most_running == 4  # never more than the limit, and it was reached
    assert polls == []  # nobody slept a polling second
    assert wall < 0.9  # 4 waves of 50 ms; atroposlib's polling made this >= 1 s


def test_rollouts_judge_and_teacher_requests_share_one_pool(polls) -> None:
    # atroposlib gives the eval split (our judge and teacher) a second pool: 2x the limit.
    servers = manager([0.05], slots=3)

    async def main() -> None:
        train = [servers.tokens_and_logprobs_completion(input_ids=[1], max_tokens=1) for _ in range(6)]
        judge = [servers.chat_completion(messages=[{"role": "user", "content": "x"}], n=1, split="eval") for _ in range(6)]
        scoring = [servers.get_logprobs(input_ids=[1, 2], top_k=1, split="eval") for _ in range(6)]
        await asyncio.gather(*train, *judge, *scoring)

    run_loop(main())
    (server,) = servers.servers
    assert server.served == 18 and server.most_running == 3


def test_several_full_servers_hand_waiting_requests_to_whichever_frees_a_slot(polls) -> None:
    servers = manager([0.4, 0.02], slots=1)

    async def main() -> None:
        await asyncio.gather(*(servers.tokens_and_logprobs_completion(input_ids=[1], max_tokens=1) for _ in range(12)))

    run_loop(main())
    slow, fast = servers.servers
    assert slow.served + fast.served == 12
    assert fast.served >= 9  # the fast server took the queue (stuck behind the slow one it would get ~6)
    assert polls == [] and slow.most_running == fast.most_running == 1


def test_servers_of_any_class_get_one_pool_that_wakes_waiters(polls) -> None:
    class AtroposPools(TimedServer):
        """A server class with atroposlib's own two semaphores, which tell nobody of a release."""

        def __init__(self, config: APIServerConfig, latency: float) -> None:
            super().__init__(config, latency)
            self.sem = AsyncSemWithAdaptiveWeight(config.num_max_requests_at_once)
            self.eval_sem = AsyncSemWithAdaptiveWeight(config.num_requests_for_eval)

    servers = manager([0.02, 0.02], slots=1, base=AtroposPools)

    async def main() -> None:
        train = [servers.tokens_and_logprobs_completion(input_ids=[1], max_tokens=1) for _ in range(4)]
        scoring = [servers.get_logprobs(input_ids=[1, 2], top_k=1, split="eval") for _ in range(4)]
        await asyncio.wait_for(asyncio.gather(*train, *scoring), timeout=5)  # a waiter never woken would hang

    run_loop(main())
    assert sum(s.served for s in servers.servers) == 8
    assert polls == [] and all(s.most_running == 1 for s in servers.servers)


def test_a_cancelled_waiter_does_not_swallow_the_next_free_slot(polls) -> None:
    servers = manager([0.05, 0.05], slots=1)

    async def main() -> int:
        tasks = [asyncio.create_task(servers.tokens_and_logprobs_completion(input_ids=[1], max_tokens=1)) for _ in range(6)]
        await asyncio.sleep(0.01)
        tasks[3].cancel()  # waiting: both servers are busy
        done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=5)
        return sum(not isinstance(r, BaseException) for r in done)

    assert run_loop(main()) == 5


def test_groups_to_fill_covers_the_slots_times_the_oversubscription() -> None:
    assert groups_to_fill(32, 4, 1.5) == 12
    assert groups_to_fill(16, 4, 1.0) == 4
    assert groups_to_fill(1, 8, 1.5) == 1
    assert groups_to_fill(128, 8, 1.5) == 24
    with pytest.raises(ValueError):
        groups_to_fill(0, 4, 1.5)
    with pytest.raises(ValueError):
        groups_to_fill(4, 4, 0.5)


def test_run_loop_uses_uvloop_unless_told_not_to() -> None:
    async def kind() -> str:
        return "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"

    assert run_loop(kind()) == "uvloop"
    assert run_loop(kind(), use_uvloop=False) == "asyncio"


def _reference_row(row, actual, k):
    """The obvious implementation: sort by logprob descending, ties by id, cut to K."""
    if not row:
        return [], [], None
    entries = sorted(((int(t), float(e["logprob"])) for t, e in row.items()), key=lambda p: (-p[1], p[0]))
    return [t for t, _ in entries[:k]], [lp for _, lp in entries[:k]], next((lp for t, lp in entries if t == actual), None)


def test_batched_normalisation_equals_the_row_by_row_definition() -> None:
    rng = random.Random(3)
    k = 5
    tokens, rows = [], []
    for position in range(300):
        token = rng.randrange(50)
        if position == 0 or rng.random() < 0.05:
            rows.append(None if position == 0 else {})
        else:
            ids = rng.sample(range(50), k + (rng.random() < 0.5))  # K or K+1 entries, as vLLM sends
            # Coarse logprobs so ties are common (broken by id).
            rows.append({str(i): {"logprob": -rng.randrange(6) / 2, "rank": 1} for i in ids})
        tokens.append(token)
    ids, lps, actual = normalise_topk_rows(tokens, rows, k)
    expected = [_reference_row(row, token, k) for token, row in zip(tokens, rows)]
    assert ids == [e[0] for e in expected]
    assert lps == [e[1] for e in expected]
    assert actual == [e[2] for e in expected]
    assert normalise_topk_rows([tokens[1]], [rows[1]], k) == ([expected[1][0]], [expected[1][1]], [expected[1][2]])
    assert normalise_topk_rows([], [], k) == ([], [], [])


# ---- the client's decoding, against a scripted HTTP server

def _serve_body(body: bytes):
    """An aiohttp app on loopback answering every POST with `body`; returns (runner, /v1 URL)."""
    from aiohttp import web

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=body, content_type="application/json")

    async def start():
        app = web.Application()
        app.router.add_post("/v1/completions", answer)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        return runner, f"http://127.0.0.1:{port}/v1"

    return start


def _score_against(body: bytes, servers: list | None = None, **kwargs):
    async def main():
        runner, url = await _serve_body(body)()
        server = OpenAIVLLMServer(APIServerConfig(model_name="m", base_url=url, api_key="x", timeout=10))
        if servers is not None:
            servers.append(server)
        try:
            return await server._get_logprobs_wrapper(input_ids=[5, 6, 7], top_k=2, **kwargs)
        finally:
            await server.close()
            await runner.cleanup()

    return run_loop(main())


def test_scoring_answers_that_are_not_strict_json_still_parse() -> None:
    # Python's json accepts -Infinity; a server that sends it must not fail the whole request.
    body = (b'{"choices": [{"prompt_logprobs": [null, {"6": {"logprob": -0.5}, "9": {"logprob": -Infinity}, "3": {"logprob": -0.1}},'
            b' {"7": {"logprob": -2.0}, "1": {"logprob": -0.2}, "2": {"logprob": -0.3}}]}]}')
    result = _score_against(body)
    assert result["prompt_topk_token_ids"] == [[], [3, 6], [1, 2]]
    assert result["prompt_topk_logprobs"] == [[], [-0.1, -0.5], [-0.2, -0.3]]
    assert result["prompt_token_logprobs"] == [None, -0.5, -2.0]
    assert _score_against(body, rows_from=2)["prompt_topk_token_ids"] == [[], [], [1, 2]]


@pytest.mark.parametrize("body, message", [
    (b"<html>busy</html>", "not JSON"),
    (b'{"choices": [{"prompt_logprobs": [null, {"x": 1}]}]}', "unexpected answer"),
    (b'{"choices": [{"prompt_logprobs": [null, {"6": {"logprob": -Infinity, "rank": "x"}}, "row"]}]}', "unexpected answer"),
    (b'{"choices": [{"prompt_logprobs": [null]}]}', "1 prompt-logprob rows for 3 tokens"),
])
def test_malformed_scoring_answers_fail_with_a_clear_error(body: bytes, message: str) -> None:
    from opd.serving.vllm_client import ServerRequestError

    servers: list = []
    with pytest.raises(ServerRequestError, match=message):
        _score_against(body, servers)
    assert servers[0].request_errors == 1  # counted in summary/server_request_errors
