"""Framework overhead: rollouts/s through the whole stack against a fixed-latency scripted server,
beside a bare HTTP client's rate against the same server in the same run."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from experiments.bench.common import FIXTURE, compose, environment, generate_rollouts, get_json, median, scripted_server

logger = logging.getLogger(__name__)


async def bare_client(url: str, limit: int, requests: int, prompt: list[int]) -> dict[str, float]:
    """The ceiling of this machine: nothing but `limit` concurrent POSTs of the same request body
    (one aiohttp session, no env, no runner), against the same scripted server."""
    import aiohttp

    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": 64, "logprobs": 0, "return_token_ids": True}).encode()
    slots = asyncio.Semaphore(limit)
    latencies: list[float] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one() -> None:
            async with slots:
                sent = time.perf_counter()
                async with session.post(f"{url}/completions", data=body, headers={"Content-Type": "application/json"}) as resp:
                    await resp.read()
                latencies.append(time.perf_counter() - sent)

        started, cpu0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(one() for _ in range(requests)))
        return {"wall_s": time.perf_counter() - started, "cpu_s": time.process_time() - cpu0, "request_ms": 1000 * sum(latencies) / len(latencies)}


def first_prompt(cfg: Any) -> list[int]:
    """The token ids the env sends for its first problem (the bare client sends the same)."""
    env = environment(cfg, "http://127.0.0.1:9/v1")
    return env.prompt_ids(env.data.train[0]["problem"], use_pool=False)


@contextlib.contextmanager
def env_workers(cfg: Any, url: str) -> Iterator[list[Any] | None]:
    """runner.workers > 1: a local Ray cluster and its environment workers, started once for
    every repeat of a point (they take a minute to start here); else None."""
    if cfg.runner.workers == 1:
        yield None
        return
    from opd import build
    from opd.distributed.source import environment_workers

    with environment_workers(cfg, build.load_data(cfg), build.resolve_model(cfg.server.model), [url]) as workers:
        yield workers


def bench_overhead(repeats: int, latencies: tuple[float, ...] = (0.1, 1.0), limits: tuple[int, ...] = (1, 8, 32, 128), overrides: tuple[str, ...] = (),
                   workers: tuple[int, ...] = (1,)) -> Iterator[dict[str, Any]]:
    """One request per rollout (the answer needs no tool). The in-flight limit is the server's
    request limit (`server.max_requests_in_flight`); the runner sizes the groups in flight itself
    (`runner.groups_in_flight=null`). Reported against the ideal (limit / latency) and against the
    bare client's rate (what the machine allows), for each count of environment processes
    (`runner.workers`; above 1 on a local Ray cluster, or the one `RAY_ADDRESS` names; the CPU time
    is then the driver's in `env_cpu_ms_per_rollout` and the workers' in `workers_cpu_ms_per_rollout`)."""
    from opd.event_loop import run_loop

    skipped = [(limit, count) for limit in limits for count in workers if count > limit]
    if skipped:
        logger.warning("overhead: skipping %d point(s) with more workers than request slots (in flight, workers): %s", len(skipped), skipped)
    for latency_s in latencies:
        with scripted_server(latency_s) as url, tempfile.TemporaryDirectory() as tmp:
            # Each worker needs a request slot of its own (runner.workers <= max_requests_in_flight).
            for limit, count in ((limit, count) for limit in limits for count in workers if count <= limit):
                cfg = compose([
                    "env=inline_math", "server=vllm", f"server.model={FIXTURE}", f"server.base_urls=[{url}]",
                    f"group_size={min(limit, 8)}", "runner.groups_in_flight=null", f"server.max_requests_in_flight={limit}",
                    "env.dynamic_shots=0", f"runner.workers={count}",
                ], overrides)
                prompt = first_prompt(cfg)
                rollouts = max(limit * 10, 40)
                runs, bare = [], []
                with env_workers(cfg, url) as started:
                    # Untimed: the first groups of a fresh process pay for lazy set-up (math-verify's pool, caches).
                    run_loop(generate_rollouts(cfg, url, rollouts // 4, Path(tmp) / f"w{limit}-{count}.jsonl", started), cfg.runner.uvloop)
                    for r in range(repeats):
                        get_json(url.removesuffix("/v1") + "/stats")
                        runs.append(run_loop(generate_rollouts(cfg, url, rollouts, Path(tmp) / f"o{limit}-{count}-{r}.jsonl", started), cfg.runner.uvloop))
                        bare.append(run_loop(bare_client(url, limit, rollouts, prompt), cfg.runner.uvloop))
                ideal = limit / latency_s
                ratios = [run["rollouts"] / run["wall_s"] / ideal for run in runs]
                ceiling = [rollouts / b["wall_s"] / ideal for b in bare]
                yield {
                    "bench": "overhead", "in_flight": limit, "latency_s": latency_s, "workers": count, "rollouts": runs[0]["rollouts"],
                    "ideal_rollouts_per_s": ideal, "rollouts_per_s": median([run["rollouts"] / run["wall_s"] for run in runs]),
                    "fraction_of_ideal": median(ratios), "fraction_of_ideal_runs": [round(x, 3) for x in ratios],
                    "bare_client_fraction_of_ideal": median(ceiling), "fraction_of_bare_client": median(ratios) / median(ceiling),
                    "env_cpu_ms_per_rollout": median([1000 * run["cpu_s"] / run["rollouts"] for run in runs]),
                    # With workers: the driver's part above, the workers' (all of them) here.
                    "workers_cpu_ms_per_rollout": median([1000 * run["workers_cpu_s"] / run["rollouts"] for run in runs]),
                    "bare_client_cpu_ms_per_request": median([1000 * b["cpu_s"] / rollouts for b in bare]),
                    # Closing the env after the last group (once per run; not in the rate above).
                    "close_ms": median([1000 * run["close_s"] for run in runs]),
                    # Where a rollout's time went (ms per rollout by phase, median of the repeats;
                    # opd.latency), beside a bare request's round trip in the same run.
                    "latency_ms": {name: round(median([run["latency_ms"].get(name, 0.0) for run in runs]), 2) for name in runs[0]["latency_ms"]},
                    "bare_client_request_ms": median([b["request_ms"] for b in bare]),
                    "event_loop": "uvloop" if cfg.runner.uvloop else "asyncio",
                }
