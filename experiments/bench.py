"""Benchmarks: `python -m experiments.bench <name> [--repeats N]`, names: overhead, opd, records,
startup, e2e, all.

Each result is one JSON line on stdout, also appended to outputs/bench/<name>.jsonl with the time,
git commit and host. These machines are noisy: every ratio is measured within one run, repeated,
and reported as the median with the individual values.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

logger = logging.getLogger("experiments.bench")
ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"


# ---------------------------------------------------------------- helpers

# Hydra overrides added to every bench's config (`--set KEY=VALUE`, repeatable).
EXTRA_OVERRIDES: list[str] = []


def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    from opd.config import register, validate

    register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return validate(compose(config_name="config", overrides=["output_dir=/tmp/opd-bench-unused", "tracking.enabled=false", "runner.progress=false", *overrides, *EXTRA_OVERRIDES]))


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


@contextlib.contextmanager
def loopback(latency_s: float, fail_every: int = 0) -> Iterator[str]:
    """The scripted server (opd/bench/loopback.py) in its own process; yields its /v1 URL."""
    from opd.fixture.build import ensure_fixture
    from opd.serving.local_vllm import free_port
    from opd.serving.watch import healthy

    port = free_port()
    # Its log goes to a file: a pipe nobody reads while it runs would fill and stall the server.
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        [sys.executable, "-m", "opd.bench.loopback", "--port", str(port), "--latency", str(latency_s), "--tokenizer", str(ensure_fixture()),
         "--fail-every", str(fail_every)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log,
    )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 60
        while not healthy(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                raise RuntimeError(f"loopback server did not start: {log.read().decode(errors='replace')[-2000:]}")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


# ---------------------------------------------------------------- 1. framework overhead

async def _generate_rollouts(cfg: Any, url: str, rollouts_per_limit: int, path: Path) -> dict[str, float]:
    from opd.build import build_env, groups_in_flight, load_data, resolve_model
    from opd.records import GroupWriter
    from opd.runner import run_generation

    model = resolve_model("fixture")
    env = build_env(cfg, load_data(cfg), model, [url])
    await env.setup()
    written_at: list[float] = []

    async def stamp(group: dict[str, Any]) -> None:
        written_at.append(time.monotonic())

    cpu0 = time.process_time()
    with GroupWriter(path) as writer:
        stats = await run_generation(env, writer, rollouts_per_limit // cfg.group_size, groups_in_flight=groups_in_flight(cfg, 1),
                                     max_attempts_per_item=1, max_failed_groups=0, progress=False, on_group=stamp)
    cpu = time.process_time() - cpu0
    await env.close()
    return {"wall_s": stats.elapsed, "cpu_s": cpu, "rollouts": stats.written * cfg.group_size,
            "written_at": written_at, "groups_in_flight": groups_in_flight(cfg, 1)}


async def _bare_client(url: str, limit: int, requests: int, prompt: list[int]) -> dict[str, float]:
    """The ceiling of this machine: nothing but `limit` concurrent POSTs of the same request body
    (one aiohttp session, no env, no runner), against the same scripted server."""
    import aiohttp

    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": 64, "logprobs": 0, "return_token_ids": True}).encode()
    slots = asyncio.Semaphore(limit)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one() -> None:
            async with slots, session.post(f"{url}/completions", data=body, headers={"Content-Type": "application/json"}) as resp:
                await resp.read()

        started, cpu0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(one() for _ in range(requests)))
        return {"wall_s": time.perf_counter() - started, "cpu_s": time.process_time() - cpu0}


def bench_overhead(repeats: int, latencies: tuple[float, ...] = (0.1, 1.0), limits: tuple[int, ...] = (1, 8, 32, 128)) -> Iterator[dict[str, Any]]:
    """Rollouts/s through the whole stack (runner, env, client, HTTP) against a fixed-latency
    server, one request per rollout (the answer needs no tool). The in-flight limit is the
    server's request limit (`server.max_requests_in_flight`); the runner sizes the groups in
    flight itself (`runner.groups_in_flight=null`). Reported against the ideal (limit / latency)
    and against a bare HTTP client's rate measured in the same run (what the machine allows)."""
    from opd.loop import run_loop

    for latency_s in latencies:
        with loopback(latency_s) as url, tempfile.TemporaryDirectory() as tmp:
            for limit in limits:
                group_size = min(limit, 8)
                cfg = _compose([
                    "env=inline_math", "server=vllm", f"server.model={ROOT / 'opd/fixture/model'}", f"server.base_urls=[{url}]",
                    f"group_size={group_size}", "runner.groups_in_flight=null", f"server.max_requests_in_flight={limit}",
                    "env.dynamic_shots=0",
                ])
                prompt = _prompt_of(cfg)
                rollouts = max(limit * 10, 40)
                runs, bare = [], []
                for r in range(repeats):
                    _get(url.removesuffix("/v1") + "/stats")
                    runs.append(run_loop(_generate_rollouts(cfg, url, rollouts, Path(tmp) / f"o{limit}-{r}.jsonl"), cfg.runner.uvloop))
                    bare.append(run_loop(_bare_client(url, limit, rollouts, prompt), cfg.runner.uvloop))
                ideal = limit / latency_s
                ratios = [run["rollouts"] / run["wall_s"] / ideal for run in runs]
                ceiling = [rollouts / b["wall_s"] / ideal for b in bare]
                yield {
                    "bench": "overhead", "in_flight": limit, "latency_s": latency_s, "rollouts": runs[0]["rollouts"],
                    "ideal_rollouts_per_s": ideal, "rollouts_per_s": _median([run["rollouts"] / run["wall_s"] for run in runs]),
                    "fraction_of_ideal": _median(ratios), "fraction_of_ideal_runs": [round(x, 3) for x in ratios],
                    "bare_client_fraction_of_ideal": _median(ceiling), "fraction_of_bare_client": _median(ratios) / _median(ceiling),
                    "env_cpu_ms_per_rollout": _median([1000 * run["cpu_s"] / run["rollouts"] for run in runs]),
                    "bare_client_cpu_ms_per_request": _median([1000 * b["cpu_s"] / rollouts for b in bare]),
                    "event_loop": "uvloop" if cfg.runner.uvloop else "asyncio",
                }


def _prompt_of(cfg: Any) -> list[int]:
    """The token ids the env sends for its first problem (the bare client sends the same)."""
    from opd.build import build_env, load_data, resolve_model

    data = load_data(cfg)
    env = build_env(cfg, data, resolve_model("fixture"), ["http://127.0.0.1:9/v1"])
    return env.prompt_ids(data.train[0]["problem"], use_pool=False)


# ---------------------------------------------------------------- 2. OPD stage

def bench_opd(repeats: int, latency_s: float = 0.05) -> Iterator[dict[str, Any]]:
    """OPD stage wall time for a group of 4 x 6 turn pairs, 3 judge votes: the project's
    concurrency vs strictly sequential (env.opd.max_concurrency=1), same server limits."""
    from opd.build import build_env, load_data, resolve_model
    from opd.loop import run_loop

    with loopback(latency_s) as url:
        results: dict[int, list[float]] = {}
        pairs = 0
        for concurrency in (32, 1):
            cfg = _compose([
                "env=opd_coding", "server=vllm", f"server.model={ROOT / 'opd/fixture/model'}", f"server.base_urls=[{url}]",
                "group_size=4", "env.max_turns=6", "judge_votes=3", f"env.opd.max_concurrency={concurrency}", "distill_topk=20",
            ])
            env = build_env(cfg, load_data(cfg), resolve_model("fixture"), [url])

            async def groups() -> list[dict[str, Any]]:
                await env.setup()
                try:
                    return [(await env.collect_trajectories(await env.get_next_item()))[0] for _ in range(repeats)]
                finally:
                    await env.close()

            done = run_loop(groups(), cfg.runner.uvloop)
            results[concurrency] = [group["group_overrides"]["opd_wall_s"] for group in done]
            pairs = sum(len(o["opd_turns"]) for o in done[-1]["overrides"])
        seq, conc = _median(results[1]), _median(results[32])
        yield {
            "bench": "opd", "latency_s": latency_s, "turn_pairs": pairs, "votes": 3,
            "sequential_s": seq, "concurrent_s": conc, "speedup": seq / conc,
            "sequential_runs": results[1], "concurrent_runs": results[32],
            "requests_sequential_floor_s": 2 * pairs * latency_s,
        }


# ---------------------------------------------------------------- 4. records

def _synthetic_group(tokens: int, k: int, sequences: int = 4) -> dict[str, Any]:
    """A group like opd_coding writes: 1/4 prompt (masked), 3/4 generated with teacher rows
    (random ids and full-precision logprobs, so compression sees realistic entropy)."""
    import random

    from opd.records import DISTILL_PAD_ID, DISTILL_PAD_LOGPROB, MASK, MASKED_LOGPROB

    rng = random.Random(tokens)
    prompt = tokens // 4
    group: dict[str, Any] = {"tokens": [], "masks": [], "scores": [], "inference_logprobs": [], "distill_token_ids": [], "distill_logprobs": [],
                             "overrides": [], "group_overrides": {"item_id": "bench"}, "messages": None, "advantages": None, "ref_logprobs": None, "generation_params": {}}
    for _ in range(sequences):
        ids = [rng.randrange(150_000) for _ in range(tokens)]
        group["tokens"].append(ids)
        group["masks"].append([MASK] * prompt + ids[prompt:])
        group["inference_logprobs"].append([MASKED_LOGPROB] * prompt + [-rng.expovariate(2.0) for _ in range(tokens - prompt)])
        rows = [sorted(rng.sample(range(150_000), k)) for _ in range(tokens - prompt)]
        group["distill_token_ids"].append([[DISTILL_PAD_ID] * k for _ in range(prompt)] + rows)
        lps = [sorted((-rng.expovariate(0.5) for _ in range(k)), reverse=True) for _ in range(tokens - prompt)]
        group["distill_logprobs"].append([[DISTILL_PAD_LOGPROB] * k for _ in range(prompt)] + lps)
        group["scores"].append(rng.random())
        group["overrides"].append({"teacher_logprobs": [None] * prompt + [-rng.expovariate(2.0) for _ in range(tokens - prompt)]})
    return group


def bench_records(repeats: int, k: int = 50, sizes: tuple[int, ...] = (2048, 4096, 8192, 16384)) -> Iterator[dict[str, Any]]:
    """Assemble, check and write one group of 4 x N tokens with K distill rows; plain and gzip."""
    from opd.records import GroupWriter, check_group, read_groups

    with tempfile.TemporaryDirectory() as tmp:
        for tokens in sizes:
            group = _synthetic_group(tokens, k)
            for suffix in (".jsonl", ".jsonl.gz"):
                check, write, read = [], [], []
                size = 0
                # Peak memory of checking + writing (tracemalloc slows Python down: its own pass).
                tracemalloc.start()
                with GroupWriter(Path(tmp) / f"mem{tokens}{suffix}") as writer:
                    check_group(group)
                    writer.write(group)
                peak = tracemalloc.get_traced_memory()[1] / 2**20
                tracemalloc.stop()
                for r in range(repeats):
                    t1 = time.perf_counter()
                    problems = check_group(group)
                    t2 = time.perf_counter()
                    path = Path(tmp) / f"g{tokens}-{r}{suffix}"
                    with GroupWriter(path) as writer:
                        writer.write(group)
                    t3 = time.perf_counter()
                    assert not problems, problems
                    t4 = time.perf_counter()
                    (back,) = list(read_groups(path))
                    read.append(time.perf_counter() - t4)
                    assert back["distill_token_ids"] == group["distill_token_ids"]
                    check.append(t2 - t1)
                    write.append(t3 - t2)
                    size = path.stat().st_size
                    del back
                yield {
                    "bench": "records", "tokens_per_sequence": tokens, "sequences": 4, "k": k, "encoding": "gzip" if suffix.endswith(".gz") else "jsonl",
                    "check_s": _median(check), "write_s": _median(write), "read_s": _median(read),
                    "peak_mib": peak, "bytes": size, "write_ns_per_value": 1e9 * _median(write) / (4 * tokens * 2 * k),
                }
            del group


# ---------------------------------------------------------------- 5. start-up

def bench_startup(repeats: int, embedded: bool = False) -> Iterator[dict[str, Any]]:
    """Command to first request: a launcher subprocess against the loopback server (imports,
    config, dataset, env), with and without MLflow; optionally the embedded server cold and warm."""
    with loopback(0.01) as url:
        for tracking in (False, True):
            times = []
            for _ in range(repeats):
                with tempfile.TemporaryDirectory() as tmp:
                    urllib.request.urlopen(urllib.request.Request(url.removesuffix("/v1") + "/reset", method="POST"), timeout=10)
                    started = time.time()
                    subprocess.run([
                        sys.executable, "-m", "experiments.launch", "env=inline_math", "server=vllm", f"server.model={ROOT / 'opd/fixture/model'}",
                        f"server.base_urls=[{url}]", "total_steps=1", "group_size=1", "runner.progress=false", f"tracking.enabled={str(tracking).lower()}",
                        f"tracking.uri=sqlite:///{tmp}/mlflow.db", f"tracking.artifact_root={tmp}/mlruns", f"hydra.run.dir={tmp}/run",
                    ], cwd=ROOT, check=True, capture_output=True)
                    first = _get(url.removesuffix("/v1") + "/stats")["first_request_at"]
                    times.append(first - started)
            yield {"bench": "startup", "server": "running (server=vllm)", "tracking": tracking, "to_first_request_s": _median(times), "runs": [round(t, 2) for t in times]}
    if embedded:
        from opd.fixture.build import ensure_fixture
        from opd.serving.local_vllm import LocalVLLM, LocalVLLMSettings

        with tempfile.TemporaryDirectory() as tmp:
            for state in ("cold", "warm"):
                settings = LocalVLLMSettings(model=str(ensure_fixture()), served_model_name="fixture", workdir=Path(tmp), max_logprobs=20, startup_timeout_s=600)
                with LocalVLLM(settings) as server:
                    yield {"bench": "startup", "server": f"embedded vLLM, {state} compile cache", "to_healthy_s": server.startup_seconds}


# ---------------------------------------------------------------- 3. end to end on vLLM

def _busy_cpu_seconds() -> float:
    """CPU seconds all cores spent busy since boot (/proc/stat; NaN where there is none)."""
    try:
        fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return math.nan
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return (sum(fields[:8]) - idle) / (os.sysconf("SC_CLK_TCK") or 100)


def _gauge(metrics: str, name: str) -> float:
    """A Prometheus gauge from a /metrics text, summed over its label sets (one per model)."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith(name))


E2E_RUNS = (("inline_math", 24, ()), ("opd_coding", 10, ("env.max_turns=4", "judge_votes=3")))


@contextlib.contextmanager
def _embedded_vllm(tmp: str) -> Iterator[str]:
    """The embedded vLLM server with the fixture model; yields its /v1 URL."""
    from opd.fixture.build import ensure_fixture
    from opd.serving.local_vllm import LocalVLLM, LocalVLLMSettings

    settings = LocalVLLMSettings(model=str(ensure_fixture()), served_model_name=str(ensure_fixture()), workdir=Path(tmp), max_logprobs=20, startup_timeout_s=600)
    with LocalVLLM(settings) as server:
        yield server.base_url


def bench_e2e(repeats: int, limit: int = 16, base_url: str | None = None, runs: tuple = E2E_RUNS) -> Iterator[dict[str, Any]]:
    """Groups per minute per env on the embedded vLLM with the fixture model, and the server's
    running-request count (vLLM /metrics, sampled every 0.1 s) against the in-flight limit
    (`server.max_requests_in_flight`; the runner sizes the groups in flight itself) while there is
    work: from the first running request until fewer rollouts than the limit are left; and the
    machine's CPU use over that window (on a small CPU machine the sandboxed tools and the CPU
    server compete for the same cores). vLLM counts each of a request's `n` samples (the judge's
    votes) as a running request."""
    import threading

    from opd.fixture.build import ensure_fixture
    from opd.loop import run_loop

    with tempfile.TemporaryDirectory() as tmp:
        with _embedded_vllm(tmp) if base_url is None else contextlib.nullcontext(base_url) as url:
            metrics_url = url.removesuffix("/v1") + "/metrics"
            for env_name, groups, extra in runs:
                cfg = _compose([
                    f"env={env_name}", "server=vllm", f"server.model={ensure_fixture()}", f"server.base_urls=[{url}]",
                    "group_size=4", "runner.groups_in_flight=null", f"server.max_requests_in_flight={limit}", *extra,
                ])
                for r in range(repeats):
                    samples: list[tuple[float, float, float, float]] = []
                    missed: list[str] = []
                    stop = threading.Event()

                    def sample() -> None:
                        while not stop.is_set():
                            try:
                                text = urllib.request.urlopen(metrics_url, timeout=30).read().decode()
                            except OSError as err:  # a busy CPU server can be slow to answer: skip the sample, counted
                                logger.warning("no /metrics sample: %s", err)
                                missed.append(str(err))
                                continue
                            samples.append((time.monotonic(), _gauge(text, "vllm:num_requests_running"), _gauge(text, "vllm:num_requests_waiting"), _busy_cpu_seconds()))
                            time.sleep(0.1)

                    sampler = threading.Thread(target=sample, daemon=True)
                    sampler.start()
                    run = run_loop(_generate_rollouts(cfg, url, groups * cfg.group_size, Path(tmp) / f"{env_name}-{r}.jsonl"), cfg.runner.uvloop)
                    stop.set()
                    sampler.join()
                    # While there is work: from the first running request until fewer rollouts
                    # than the limit are left to finish.
                    first = next((t for t, running, _, _ in samples if running > 0), math.inf)
                    left_short = groups - math.ceil(limit / cfg.group_size)
                    last = run["written_at"][left_short - 1] if left_short >= 1 else first
                    window = [sample for sample in samples if first <= sample[0] <= last]
                    work = [running for _, running, _, _ in window]
                    # The whole machine's CPU use over the window (all cores busy = 1.0).
                    cpu_busy = ((window[-1][3] - window[0][3]) / (window[-1][0] - window[0][0]) / (os.cpu_count() or 1)) if len(window) > 1 else math.nan
                    yield {
                        "bench": "e2e", "env": env_name, "in_flight_limit": limit, "groups": groups,
                        "groups_in_flight": run["groups_in_flight"], "groups_per_min": 60 * groups / run["wall_s"], "wall_s": run["wall_s"],
                        "mean_running_while_work": statistics.fmean(work) if work else 0.0,
                        "running_fraction_of_limit": statistics.fmean(work) / limit if work else 0.0,
                        "mean_running_whole_run": statistics.fmean(r for _, r, _, _ in samples) if samples else 0.0,
                        "mean_waiting_whole_run": statistics.fmean(w for _, _, w, _ in samples) if samples else 0.0,
                        "machine_cpu_busy_while_work": cpu_busy,
                        "work_window_s": max(0.0, last - first) if work else 0.0,
                        "metrics_samples": len(samples), "metrics_samples_missed": len(missed),
                        "env_cpu_ms_per_rollout": 1000 * run["cpu_s"] / run["rollouts"],
                    }


BENCHES: dict[str, Callable[..., Iterator[dict[str, Any]]]] = {
    "overhead": bench_overhead, "opd": bench_opd, "records": bench_records, "startup": bench_startup, "e2e": bench_e2e,
}


def _context() -> dict[str, str]:
    from opd.tracking import git_commit

    return {"at": time.strftime("%Y-%m-%dT%H:%M:%S"), "git_commit": git_commit(ROOT)[:12], "host": platform.node(), "cpus": str(os.cpu_count())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.bench", description=__doc__.split("\n")[0])
    parser.add_argument("name", choices=[*BENCHES, "all"])
    parser.add_argument("--repeats", type=int, default=3, help="measurements per point (the median is reported)")
    parser.add_argument("--embedded", action="store_true", help="startup: also time the embedded vLLM server cold and warm")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "bench")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a Hydra override for every run's config, e.g. runner.oversubscribe=2")
    args = parser.parse_args(argv)
    EXTRA_OVERRIDES[:] = args.set
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    context = {**_context(), **({"overrides": " ".join(args.set)} if args.set else {})}
    for name in (list(BENCHES) if args.name == "all" else [args.name]):
        kwargs = {"embedded": args.embedded} if name == "startup" else {}
        with open(args.out / f"{name}.jsonl", "a", encoding="utf-8") as log:
            for result in BENCHES[name](args.repeats, **kwargs):
                line = json.dumps({**result, **context}, default=float)
                sys.stdout.write(line + "\n")
                sys.stdout.flush()
                log.write(line + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
