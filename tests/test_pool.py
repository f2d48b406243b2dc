"""The server pool (opd.serving.pool): one pool of slots per server for every kind of request,
first come first served without polling, balanced over several servers, bounded retries; and the
client's decoding of vLLM's answers (opd.serving.vllm_client)."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from opd.event_loop import run_loop
from opd.runner import groups_to_fill
from opd.serving.pool import ServerPool
from opd.serving.vllm_client import Generation, PromptScores, ServerRequestError, VLLMClient, normalise_topk_rows
from scripted import ScriptedClient


def timed(latency: float, url: str = "http://scripted/v1") -> ScriptedClient:
    """A client whose every request takes `latency` seconds."""
    return ScriptedClient(
        generate=lambda ids, **_: Generation([7], [-0.5], "stop"),
        score=lambda ids, k: PromptScores([], [], []),
        chat=lambda messages, n: ["ok"] * n,
        latency=latency, base_url=url,
    )


def test_oversubscribed_requests_queue_for_the_slots_without_polling() -> None:
    client = timed(0.05)
    pool = ServerPool([client], slots=4)

    async def main() -> float:
        started = time.perf_counter()
        await asyncio.gather(*(pool.generate([1, 2], max_tokens=1, temperature=1.0) for _ in range(16)))
        return time.perf_counter() - started

    wall = run_loop(main())
    assert client.served == 16 and client.most_running == 4  # never more than the limit, and it was reached
    # 4 waves of 50 ms; polling once a second (atroposlib's manager) made this >= 1 s.
    assert wall < 0.9


def test_a_request_times_its_wait_for_a_slot_apart_from_the_request_itself() -> None:
    from opd import latency

    pool = ServerPool([timed(0.05)], slots=1)

    async def one() -> latency.Ledger:
        ledger = latency.Ledger()
        await latency.within(ledger, pool.generate([1, 2], max_tokens=1, temperature=1.0))
        return ledger

    async def main() -> list[latency.Ledger]:
        return await asyncio.gather(one(), one())

    first, second = run_loop(main())
    assert first.phases["request"] >= 0.045 and second.phases["request"] >= 0.045  # timers may fire a little early
    # The second waited for the first's slot (a whole request), the first for none.
    assert first.phases["slot"] < 0.045 <= second.phases["slot"]


def test_rollouts_judge_and_teacher_requests_share_one_pool() -> None:
    client = timed(0.05)
    pool = ServerPool([client], slots=3)

    async def main() -> None:
        train = [pool.generate([1], max_tokens=1, temperature=1.0) for _ in range(6)]
        judge = [pool.chat([{"role": "user", "content": "x"}], n=1, max_tokens=8, temperature=0.7) for _ in range(6)]
        scoring = [pool.score([1, 2], 1) for _ in range(6)]
        await asyncio.gather(*train, *judge, *scoring)

    run_loop(main())
    assert client.served == 18 and client.most_running == 3


def test_several_full_servers_hand_waiting_requests_to_whichever_frees_a_slot() -> None:
    slow, fast = timed(0.4, "http://slow/v1"), timed(0.02, "http://fast/v1")
    pool = ServerPool([slow, fast], slots=1)

    async def main() -> None:
        await asyncio.gather(*(pool.generate([1], max_tokens=1, temperature=1.0) for _ in range(12)))

    run_loop(main())
    assert slow.served + fast.served == 12
    assert fast.served >= 9  # the fast server took the queue (stuck behind the slow one it would get ~6)
    assert slow.most_running == fast.most_running == 1


def test_a_cancelled_waiter_does_not_swallow_the_next_free_slot() -> None:
    pool = ServerPool([timed(0.05, "http://a/v1"), timed(0.05, "http://b/v1")], slots=1)

    async def main() -> int:
        tasks = [asyncio.create_task(pool.generate([1], max_tokens=1, temperature=1.0)) for _ in range(6)]
        await asyncio.sleep(0.01)
        tasks[3].cancel()  # waiting: both servers are busy
        done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=5)
        return sum(not isinstance(r, BaseException) for r in done)

    assert run_loop(main()) == 5
    assert pool.free == [1, 1]  # every slot came back


def test_failures_that_may_pass_are_retried_and_others_are_not() -> None:
    answers: list = [ServerRequestError("connection refused"), ServerRequestError("HTTP 503", 503), Generation([7], [-0.1], "stop")]

    def flaky(ids, **_):
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    pool = ServerPool([ScriptedClient(generate=flaky)], slots=1, max_attempts=3, backoff_s=0.01)
    (gen,) = run_loop(pool.generate([1], max_tokens=1, temperature=1.0))
    assert gen.token_ids == [7] and pool.retries == 2

    refused = ServerPool([ScriptedClient(score=lambda ids, k: (_ for _ in ()).throw(ServerRequestError("max allowed: 2", 400)))], slots=1, backoff_s=0.01)
    with pytest.raises(ServerRequestError, match="max allowed"):
        run_loop(refused.score([1, 2], 4))
    assert refused.retries == 0  # a 4xx will not pass: no retry

    down = ServerPool([ScriptedClient(generate=lambda ids, **_: (_ for _ in ()).throw(ServerRequestError("connection refused")))], slots=1, max_attempts=2, backoff_s=0.01)
    with pytest.raises(ServerRequestError, match="connection refused"):  # the cause itself, not a wrapper
        run_loop(down.generate([1], max_tokens=1, temperature=1.0))
    assert down.retries == 1 and down.free == [1]


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

async def _serve(route: str, answer, **runner_options: float):
    """A real HTTP server (aiohttp) on loopback answering POSTs to /v1`route` with `answer`
    (`runner_options`: aiohttp's AppRunner's, e.g. keepalive_timeout); (its runner, its /v1 URL)."""
    from aiohttp import web

    app = web.Application()
    app.router.add_post(f"/v1{route}", answer)
    runner = web.AppRunner(app, **runner_options)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1"


async def _serve_body(body: bytes):
    """A server answering every POST to /v1/completions with `body`; (runner, /v1 URL)."""
    from aiohttp import web

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=body, content_type="application/json")

    return await _serve("/completions", answer)


def _score_against(body: bytes, servers: list | None = None, **kwargs):
    async def main():
        runner, url = await _serve_body(body)
        server = VLLMClient(url, "m", timeout_s=10)
        if servers is not None:
            servers.append(server)
        try:
            return await server.score([5, 6, 7], 2, **kwargs)
        finally:
            await server.close()
            await runner.cleanup()

    return run_loop(main())


def test_scoring_answers_that_are_not_strict_json_still_parse() -> None:
    # Python's json accepts -Infinity; a server that sends it must not fail the whole request.
    body = (b'{"choices": [{"prompt_logprobs": [null, {"6": {"logprob": -0.5}, "9": {"logprob": -Infinity}, "3": {"logprob": -0.1}},'
            b' {"7": {"logprob": -2.0}, "1": {"logprob": -0.2}, "2": {"logprob": -0.3}}]}]}')
    result = _score_against(body)
    assert result.top_ids == [[], [3, 6], [1, 2]]
    assert result.top_logprobs == [[], [-0.1, -0.5], [-0.2, -0.3]]
    assert result.token_logprobs == [None, -0.5, -2.0]
    assert _score_against(body, rows_from=2).top_ids == [[], [], [1, 2]]


@pytest.mark.parametrize("body, message", [
    (b"<html>busy</html>", "not JSON"),
    (b'{"choices": [{"prompt_logprobs": [null, {"x": 1}]}]}', "unexpected answer"),
    (b'{"choices": [{"prompt_logprobs": [null, {"6": {"logprob": -Infinity, "rank": "x"}}, "row"]}]}', "unexpected answer"),
    (b'{"choices": [{"prompt_logprobs": [null]}]}', "1 prompt-logprob rows for 3 tokens"),
])
def test_malformed_scoring_answers_fail_with_a_clear_error(body: bytes, message: str) -> None:
    servers: list = []
    with pytest.raises(ServerRequestError, match=message):
        _score_against(body, servers)
    assert servers[0].request_errors == 1  # the client's failed attempts (a pool's failed requests: summary/server_request_errors)
    assert message in servers[0].last_error  # and its message kept for the trainer's warning


def test_failed_requests_are_warned_about_at_most_once_per_window(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every failure used to be only counted; a flood of them must not flood the console either."""
    import opd.serving.pool as pool_module
    from opd.serving.pool import FailureWarnings

    clock = [100.0]
    monkeypatch.setattr(pool_module.time, "monotonic", lambda: clock[0])
    warnings = FailureWarnings(every_s=30.0)
    with caplog.at_level("WARNING", logger="opd.serving.pool"):
        warnings.failed(ServerRequestError("POST x answered HTTP 503"), "retrying (attempt 1/3)")
        for _ in range(5):
            clock[0] += 1
            warnings.failed(ServerRequestError("POST x timed out"), "retrying (attempt 1/3)")
        clock[0] += 30
        warnings.failed(ServerRequestError("POST x answered HTTP 500"), "given up after attempt 3/3")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert "retrying (attempt 1/3): POST x answered HTTP 503" in lines[0]
    assert "given up after attempt 3/3: POST x answered HTTP 500; 5 more failed since the last such warning" in lines[1]


def test_a_pool_warns_about_a_request_that_failed(caplog: pytest.LogCaptureFixture) -> None:
    calls = {"n": 0}

    def flaky(prompt_ids, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise ServerRequestError("POST http://scripted/v1/completions answered HTTP 503", 503)
        return Generation([1], [-0.5], "stop")

    pool = ServerPool([ScriptedClient(generate=flaky)], slots=1, max_attempts=2, backoff_s=0.01)
    with caplog.at_level("WARNING", logger="opd.serving.pool"):
        run_loop(pool.generate([1, 2], max_tokens=1, temperature=1.0))
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("inference request failed, retrying (attempt 1/2): POST http://scripted/v1/completions answered HTTP 503")


# ---- requests counted apart; idle connections the server closed ---------------------------------


def test_requests_that_failed_for_good_retries_and_cancelled_ones_are_counted_apart() -> None:
    """summary/server_request_errors counts requests that failed for good: one retried and then
    answered is a retry, one cut off by the run's end (cancelled, or failing as the pool closes)
    is cancelled; none of them is a failure."""
    from aiohttp import web

    statuses = [503, 200]

    async def busy_once(request: web.Request) -> web.Response:
        await request.read()
        status = statuses.pop(0)
        return web.json_response({"choices": [{"index": 0, "message": {"content": "ok"}, "finish_reason": "stop"}]} if status == 200 else {}, status=status)

    async def answered_after_a_retry() -> ServerPool:
        runner, url = await _serve("/chat/completions", busy_once)
        pool = ServerPool([VLLMClient(url, "m", timeout_s=10)], slots=1, backoff_s=0.01)
        try:
            await pool.chat([{"role": "user", "content": "hi"}], n=1, max_tokens=1, temperature=0.0)
        finally:
            await pool.close()
            await runner.cleanup()
        return pool

    pool = run_loop(answered_after_a_retry())
    assert pool.request_errors == 0 and pool.retries == 1  # answered in the end: no error (before: 1, the 503)
    assert (pool.counts.failed, pool.counts.retries) == (0, 1)

    down = ServerPool([ScriptedClient(generate=lambda ids, **_: (_ for _ in ()).throw(ServerRequestError("refused")))], slots=1, max_attempts=2, backoff_s=0.01)
    with pytest.raises(ServerRequestError):
        run_loop(down.generate([1], max_tokens=1, temperature=1.0))
    assert (down.counts.failed, down.counts.retries, down.request_errors) == (1, 1, 1)

    slow = ServerPool([timed(5.0)], slots=1)

    async def cut_off() -> None:
        request = asyncio.create_task(slow.generate([1], max_tokens=1, temperature=1.0))
        waiting = asyncio.create_task(slow.generate([1], max_tokens=1, temperature=1.0))  # for the one slot
        await asyncio.sleep(0.05)
        request.cancel()
        waiting.cancel()
        await asyncio.gather(request, waiting, return_exceptions=True)

    run_loop(cut_off())
    assert slow.counts == type(slow.counts)(cancelled=2)

    def failing_once_closed(ids, **_):
        raise ServerRequestError("Session is closed")

    closing = ServerPool([ScriptedClient(generate=failing_once_closed)], slots=1, max_attempts=3, backoff_s=0.01)

    async def closed_under_it() -> None:
        await closing.close()
        with pytest.raises(ServerRequestError):
            await closing.generate([1], max_tokens=1, temperature=1.0)

    run_loop(closed_under_it())
    assert closing.counts == type(closing.counts)(cancelled=1)


class _ClosesIdleConnections:
    """A real HTTP server (aiohttp, on its own thread and event loop) that answers chat requests
    and closes a connection idle for `idle_s` seconds, as vLLM does after 5 s."""

    def __init__(self, idle_s: float) -> None:
        import threading

        self.idle_s = idle_s
        self.served = 0
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    async def _serve(self) -> None:
        from aiohttp import web

        async def chat(request: web.Request) -> web.Response:
            await request.read()
            self.served += 1
            return web.json_response({"choices": [{"index": 0, "message": {"content": "ok"}, "finish_reason": "stop"}]})

        runner, self.url = await _serve("/chat/completions", chat, keepalive_timeout=self.idle_s)
        self._stop, self._loop = asyncio.Event(), asyncio.get_running_loop()
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    def __enter__(self) -> "_ClosesIdleConnections":
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


def _requests_idle_between(url: str, requests: int, idle_s: float, **client: float) -> tuple[ServerPool, float]:
    """`requests` chat requests through a pool, `idle_s` between them during which the client's
    event loop is busy (blocked, as on a loaded machine): the server's close of the idle connection
    is not read before the next request goes out. Returns the pool and the longest request."""
    pool = ServerPool([VLLMClient(url, "m", timeout_s=10, **client)], slots=1, max_attempts=3, backoff_s=1.0)

    async def main() -> float:
        longest = 0.0
        try:
            for _ in range(requests):
                started = time.perf_counter()
                assert await pool.chat([{"role": "user", "content": "hi"}], n=1, max_tokens=1, temperature=0.0)
                longest = max(longest, time.perf_counter() - started)
                time.sleep(idle_s)
        finally:
            await pool.close()
        return longest

    return pool, run_loop(main())


@pytest.mark.parametrize(("server_idle_s", "client_idle_s"), [pytest.param(1.0, 2.0, marks=pytest.mark.slow), (0.25, 0.5)])
def test_a_pooled_connection_the_server_closed_is_never_the_cause_of_a_failed_request(server_idle_s: float, client_idle_s: float) -> None:
    """The server closes idle connections after 1 s; the client is idle 2 s between requests (and
    the same scaled down). With the default keep-alive (3 s, above this server's: a server or proxy
    that closes sooner than vLLM) the client meets the closed connection, and the request is sent
    again at once on a new one: no error, no backoff (1 s here), counted as a reconnect (before:
    "Server disconnected", a request error retried after the backoff). A client whose keep-alive
    is below the server's opens a new connection itself: nothing to count at all."""
    with _ClosesIdleConnections(idle_s=server_idle_s) as server:
        above, longest = _requests_idle_between(server.url, requests=3, idle_s=client_idle_s)
        assert (above.retries, above.clients[0].request_errors) == (0, 0)
        assert (above.counts.failed, above.counts.retries) == (0, 0)
        assert above.counts.reconnects >= 1  # the second request reused the closed connection
        assert longest < 0.9  # sent again at once, not after the pool's backoff
        below, _ = _requests_idle_between(server.url, requests=3, idle_s=client_idle_s, keepalive_s=server_idle_s / 2)
        assert below.counts == type(below.counts)()  # no failure, no retry, no reconnect
        assert server.served == 6
