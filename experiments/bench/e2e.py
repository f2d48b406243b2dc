"""End to end on vLLM with the fixture model: groups per minute, and how busy the server is kept."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import statistics
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from experiments.bench.common import compose, embedded_vllm, generate_rollouts

logger = logging.getLogger(__name__)

E2E_RUNS = (("inline_math", 24, ()), ("opd_coding", 10, ("env.max_turns=4", "judge_votes=3")))


def busy_cpu_seconds() -> float:
    """CPU seconds all cores spent busy since boot (/proc/stat; NaN where there is none)."""
    try:
        fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return math.nan
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return (sum(fields[:8]) - idle) / (os.sysconf("SC_CLK_TCK") or 100)


def gauge(metrics: str, name: str) -> float:
    """A Prometheus gauge from a /metrics text, summed over its label sets (one per model)."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith(name))


@dataclass(frozen=True)
class Sample:
    at: float  # monotonic seconds
    running: float  # vllm:num_requests_running
    waiting: float  # vllm:num_requests_waiting
    busy_cpu_s: float  # the machine's busy CPU seconds so far


@dataclass
class MetricsSampler:
    """Reads vLLM's /metrics every 0.1 s on a thread while a run goes on; failed reads are counted."""

    url: str
    samples: list[Sample] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)

    @contextlib.contextmanager
    def running(self) -> Iterator["MetricsSampler"]:
        stop = threading.Event()
        thread = threading.Thread(target=self._loop, args=(stop,), daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()

    def _loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                text = urllib.request.urlopen(self.url, timeout=30).read().decode()
            except OSError as err:  # a busy CPU server can be slow to answer: skip the sample, counted
                logger.warning("no /metrics sample: %s", err)
                self.missed.append(str(err))
                continue
            self.samples.append(Sample(time.monotonic(), gauge(text, "vllm:num_requests_running"), gauge(text, "vllm:num_requests_waiting"), busy_cpu_seconds()))
            time.sleep(0.1)


def work_window(samples: list[Sample], written_at: list[float], groups: int, limit: int, group_size: int) -> tuple[list[Sample], float, float]:
    """The samples while there is work (from the first running request until fewer rollouts than
    the limit are left to finish), with the window's start and end."""
    first = next((s.at for s in samples if s.running > 0), math.inf)
    left_short = groups - math.ceil(limit / group_size)
    last = written_at[left_short - 1] if left_short >= 1 else first
    return [s for s in samples if first <= s.at <= last], first, last


def machine_busy(window: list[Sample]) -> float:
    """The whole machine's CPU use over the window (all cores busy = 1.0)."""
    if len(window) < 2:
        return math.nan
    return (window[-1].busy_cpu_s - window[0].busy_cpu_s) / (window[-1].at - window[0].at) / (os.cpu_count() or 1)


def bench_e2e(repeats: int, limit: int = 16, base_url: str | None = None, runs: tuple = E2E_RUNS, overrides: tuple[str, ...] = ()) -> Iterator[dict[str, Any]]:
    """Groups per minute per env on the embedded vLLM with the fixture model, and the server's
    running-request count against the in-flight limit (`server.max_requests_in_flight`; the
    runner sizes the groups in flight itself) while there is work, with the machine's CPU use
    (on a small CPU machine the sandboxed tools and the CPU server compete for the same cores).
    vLLM counts each of a request's `n` samples (the judge's votes) as a running request."""
    from opd.event_loop import run_loop
    from opd.fixture.build import ensure_fixture

    with tempfile.TemporaryDirectory() as tmp:
        server = embedded_vllm(Path(tmp)) if base_url is None else None
        with server if server is not None else contextlib.nullcontext():
            url = server.base_url if server is not None else base_url
            for env_name, groups, extra in runs:
                cfg = compose([
                    f"env={env_name}", "server=vllm", f"server.model={ensure_fixture()}", f"server.base_urls=[{url}]",
                    "group_size=4", "runner.groups_in_flight=null", f"server.max_requests_in_flight={limit}", *extra,
                ], overrides)
                for r in range(repeats):
                    with MetricsSampler(url.removesuffix("/v1") + "/metrics").running() as sampler:
                        run = run_loop(generate_rollouts(cfg, url, groups * cfg.group_size, Path(tmp) / f"{env_name}-{r}.jsonl"), cfg.runner.uvloop)
                    window, first, last = work_window(sampler.samples, run["written_at"], groups, limit, cfg.group_size)
                    work = [s.running for s in window]
                    everything = sampler.samples
                    yield {
                        "bench": "e2e", "env": env_name, "in_flight_limit": limit, "groups": groups,
                        "groups_in_flight": run["groups_in_flight"], "groups_per_min": 60 * groups / run["wall_s"], "wall_s": run["wall_s"],
                        "mean_running_while_work": statistics.fmean(work) if work else 0.0,
                        "running_fraction_of_limit": statistics.fmean(work) / limit if work else 0.0,
                        "mean_running_whole_run": statistics.fmean(s.running for s in everything) if everything else 0.0,
                        "mean_waiting_whole_run": statistics.fmean(s.waiting for s in everything) if everything else 0.0,
                        "machine_cpu_busy_while_work": machine_busy(window),
                        "work_window_s": max(0.0, last - first) if work else 0.0,
                        "metrics_samples": len(everything), "metrics_samples_missed": len(sampler.missed),
                        "env_cpu_ms_per_rollout": 1000 * run["cpu_s"] / run["rollouts"],
                        # Where a rollout's time went, ms per rollout by phase (opd.latency).
                        "latency_ms": {name: round(ms, 2) for name, ms in run["latency_ms"].items()},
                    }
