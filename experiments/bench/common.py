"""What every benchmark shares: its config, the scripted server in its own process, the run of
rollouts through the real runner, and the median."""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "opd" / "fixture" / "model"


def compose(overrides: list[str], extra: tuple[str, ...] = ()) -> Any:
    """A validated config for a bench run: no MLflow, no progress bar; `extra` (the CLI's `--set`)
    last, so it wins."""
    from opd.config import compose as compose_config
    from opd.config import validate

    return validate(compose_config(["tracking.enabled=false", "runner.progress=false", *overrides, *extra]))


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


@contextlib.contextmanager
def scripted_server(latency_s: float, fail_every: int = 0, startup_s: float = 240) -> Iterator[str]:
    """The scripted server (opd/serving/scripted_server.py) in its own process; yields its /v1 URL.
    It has `startup_s` to answer: it imports transformers and loads a tokenizer, which takes over a
    minute on a loaded 2-core machine (a server that dies stops the wait at once)."""
    from opd.fixture.build import ensure_fixture
    from opd.serving.local_vllm import free_port
    from opd.serving.watch import healthy

    port = free_port()
    # Its log goes to a file: a pipe nobody reads while it runs would fill and stall the server.
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        [sys.executable, "-m", "opd.serving.scripted_server", "--port", str(port), "--latency", str(latency_s), "--tokenizer", str(ensure_fixture()),
         "--fail-every", str(fail_every)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log,
    )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + startup_s
        while not healthy(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                raise RuntimeError(f"scripted server did not answer within {startup_s:.0f} s or exited: {log.read().decode(errors='replace')[-2000:]}")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # a loaded machine: its shutdown can take longer
            proc.kill()
            proc.wait()
        log.close()


def environment(cfg: Any, url: str) -> Any:
    """The configured env over one server at `url`, untraced."""
    from opd import build
    from opd.tracking.traces import Tracer

    model = build.resolve_model(cfg.server.model)
    return build.environment(cfg, build.load_data(cfg), model, build.server_pool(cfg, model, [url]), Tracer.off(), build.judge_pool(cfg))


async def generate_rollouts(cfg: Any, url: str, rollouts: int, path: Path, workers: list[Any] | None = None) -> dict[str, Any]:
    """Write `rollouts` / group_size groups through the real runner (on Ray environment `workers`
    when given: `opd.distributed`); wall time until the last group is written, the time closing
    the env took after it (`close_s`), this process's CPU time (with workers, theirs too:
    `workers_cpu_s`), when each group was written (`written_at`, monotonic) and where each
    rollout's time went (`latency_ms`, ms per rollout by phase: `opd.latency`; with workers only
    the driver's phases). Neither CPU time counts math-verify's worker processes."""
    from opd import build, latency
    from opd.runner import Runner, RunnerLimits
    from opd.sinks.base import Sink, Written
    from opd.sinks.jsonl import GroupFile

    class Stamps(Sink):
        def __init__(self) -> None:
            self.at: list[float] = []

        async def write(self, written: Written) -> None:
            self.at.append(time.monotonic())

    env = environment(cfg, url)
    await env.setup()
    await env.ready()  # its set-up (the turn parser, math-verify's workers) is not what is timed
    groups = build.groups_in_flight(cfg, 1)
    stamps, file = Stamps(), GroupFile(path)
    await file.open()
    workers_cpu0 = await workers_cpu_s(workers) if workers is not None else 0.0
    ledgers: list[tuple[Any, float]] = []
    cpu0 = time.process_time()
    try:
        source: Any = env
        if workers is not None:
            from opd.distributed.source import WorkerSource

            source = WorkerSource(env, workers, cfg.runner.ray.startup_timeout_s)
        stats = await Runner(source, [file, stamps], rollouts // cfg.group_size, RunnerLimits(groups, 1, 0), progress=False,
                             latency_ledgers=ledgers).run()
        # The run's clock stops when its last group is written, as the bare client's stops at its
        # last answer: closing the env (math-verify's workers, the parser's thread, the HTTP
        # session) happens once per run, not per rollout, and is reported apart (`close_s`).
        wall_s = stats.elapsed
    finally:
        closing = time.monotonic()
        await file.close("FINISHED")
        await env.close()
    close_s = time.monotonic() - closing
    cpu_s = time.process_time() - cpu0
    workers_cpu = await workers_cpu_s(workers) - workers_cpu0 if workers is not None else 0.0
    return {"wall_s": wall_s, "close_s": close_s, "cpu_s": cpu_s, "workers_cpu_s": workers_cpu, "rollouts": stats.written * cfg.group_size,
            "written_at": stamps.at, "groups_in_flight": groups, "latency_ms": latency.breakdown(ledgers)}


async def workers_cpu_s(workers: list[Any]) -> float:
    """The CPU seconds the environment workers' processes have used so far, together."""
    import asyncio

    return sum(stats["cpu_s"] for stats in await asyncio.gather(*(w.actor.stats.remote() for w in workers)))


def embedded_vllm(workdir: Path, overrides: list[str] | None = None) -> Any:
    """The embedded vLLM server on the fixture model (not started; a context manager), as a run
    with these `overrides` starts it (with trainer=local: dev routes and an untied copy)."""
    from opd.serving.lifecycle import local_server
    from opd.fixture.build import ensure_fixture

    cfg = compose(["server.startup_timeout_s=600", *(overrides or [])])
    return local_server(cfg, str(ensure_fixture()), workdir)
