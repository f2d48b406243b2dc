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

def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    from opd.config import register, validate

    register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return validate(compose(config_name="config", overrides=["output_dir=/tmp/opd-bench-unused", "tracking.enabled=false", "runner.progress=false", *overrides]))


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
    proc = subprocess.Popen(
        [sys.executable, "-m", "opd.bench.loopback", "--port", str(port), "--latency", str(latency_s), "--tokenizer", str(ensure_fixture()),
         "--fail-every", str(fail_every)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 60
        while not healthy(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"loopback server did not start: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


# ---------------------------------------------------------------- 1. framework overhead

async def _generate_rollouts(cfg: Any, url: str, rollouts_per_limit: int, path: Path) -> dict[str, float]:
    from opd.build import build_env, load_data, resolve_model
    from opd.records import GroupWriter
    from opd.runner import run_generation

    model = resolve_model("fixture")
    env = build_env(cfg, load_data(cfg), model, [url])
    await env.setup()
    cpu0 = time.process_time()
    with GroupWriter(path) as writer:
        stats = await run_generation(env, writer, rollouts_per_limit // cfg.group_size, groups_in_flight=cfg.runner.groups_in_flight,
                                     max_attempts_per_item=1, max_failed_groups=0, progress=False)
    cpu = time.process_time() - cpu0
    await env.close()
    return {"wall_s": stats.elapsed, "cpu_s": cpu, "rollouts": stats.written * cfg.group_size}


def bench_overhead(repeats: int, latency_s: float = 0.1, limits: tuple[int, ...] = (1, 8, 32, 128)) -> Iterator[dict[str, Any]]:
    """Rollouts/s through the whole stack (runner, env, client, HTTP) against a fixed-latency
    server vs the ideal limit/latency; one request per rollout (the answer needs no tool)."""
    with loopback(latency_s) as url, tempfile.TemporaryDirectory() as tmp:
        for limit in limits:
            group_size = min(limit, 8)
            cfg = _compose([
                "env=inline_math", "server=vllm", f"server.model={ROOT / 'opd/fixture/model'}", f"server.base_urls=[{url}]",
                f"group_size={group_size}", f"runner.groups_in_flight={limit // group_size}", f"server.max_requests_in_flight={limit}",
                "env.dynamic_shots=0",
            ])
            rollouts = max(limit * 10, 40)
            runs = []
            for r in range(repeats):
                _get(url.removesuffix("/v1") + "/stats")
                runs.append(asyncio.run(_generate_rollouts(cfg, url, rollouts, Path(tmp) / f"o{limit}-{r}.jsonl")))
            ideal = limit / latency_s
            ratios = [run["rollouts"] / run["wall_s"] / ideal for run in runs]
            yield {
                "bench": "overhead", "in_flight": limit, "latency_s": latency_s, "rollouts": runs[0]["rollouts"],
                "ideal_rollouts_per_s": ideal, "rollouts_per_s": _median([run["rollouts"] / run["wall_s"] for run in runs]),
                "fraction_of_ideal": _median(ratios), "fraction_of_ideal_runs": [round(x, 3) for x in ratios],
                "env_cpu_ms_per_rollout": _median([1000 * run["cpu_s"] / run["rollouts"] for run in runs]),
            }


# ---------------------------------------------------------------- 2. OPD stage

def bench_opd(repeats: int, latency_s: float = 0.05) -> Iterator[dict[str, Any]]:
    """OPD stage wall time for a group of 4 x 6 turn pairs, 3 judge votes: the project's
    concurrency vs strictly sequential (env.opd.max_concurrency=1), same server limits."""
    from opd.build import build_env, load_data, resolve_model

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

            done = asyncio.run(groups())
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

def bench_e2e(repeats: int, total_steps: int = 8) -> Iterator[dict[str, Any]]:
    """Groups per minute per env on the embedded vLLM with the fixture model, and the server's
    running-request count (vLLM /metrics, sampled every 0.1 s) against the in-flight limit."""
    import threading

    from opd.fixture.build import ensure_fixture
    from opd.serving.local_vllm import LocalVLLM, LocalVLLMSettings

    with tempfile.TemporaryDirectory() as tmp:
        settings = LocalVLLMSettings(model=str(ensure_fixture()), served_model_name=str(ensure_fixture()), workdir=Path(tmp), max_logprobs=20, startup_timeout_s=600)
        with LocalVLLM(settings) as server:
            metrics_url = server.base_url.removesuffix("/v1") + "/metrics"
            for env_name, extra in (("inline_math", []), ("opd_coding", ["env.max_turns=4", "judge_votes=3"])):
                group_size, groups_in_flight = 4, 4
                cfg = _compose([
                    f"env={env_name}", "server=vllm", f"server.model={ensure_fixture()}", f"server.base_urls=[{server.base_url}]",
                    f"group_size={group_size}", f"runner.groups_in_flight={groups_in_flight}", *extra,
                ])
                limit = group_size * groups_in_flight
                for r in range(repeats):
                    samples: list[float] = []
                    stop = threading.Event()

                    def sample() -> None:
                        while not stop.is_set():
                            text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
                            samples.append(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:num_requests_running")))
                            time.sleep(0.1)

                    sampler = threading.Thread(target=sample, daemon=True)
                    sampler.start()
                    run = asyncio.run(_generate_rollouts(cfg, server.base_url, total_steps * group_size, Path(tmp) / f"{env_name}-{r}.jsonl"))
                    stop.set()
                    sampler.join()
                    busy = [s for s in samples if s > 0]
                    yield {
                        "bench": "e2e", "env": env_name, "in_flight_limit": limit, "groups": total_steps,
                        "groups_per_min": 60 * total_steps / run["wall_s"], "wall_s": run["wall_s"],
                        "mean_running": statistics.fmean(samples) if samples else 0.0,
                        "mean_running_while_busy": statistics.fmean(busy) if busy else 0.0,
                        "running_fraction_of_limit": (statistics.fmean(samples) / limit) if samples else 0.0,
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
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    context = _context()
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
