"""The closed loop: one iteration's breakdown (generate, train, refresh, evaluate) and how long the
server sat idle while the trainer worked."""

from __future__ import annotations

import contextlib
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from experiments.bench.common import compose, embedded_vllm
from experiments.bench.e2e import MetricsSampler


def _timed(obj: Any, name: str, spans: list[tuple[float, float]]) -> None:
    """Record (start, end) of every call of the coroutine method `obj.name`."""
    original = getattr(obj, name)

    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        try:
            return await original(*args, **kwargs)
        finally:
            spans.append((started, time.monotonic()))

    setattr(obj, name, wrapper)


async def _loop(cfg: Any, url: str, out: Path) -> dict[str, Any]:
    from opd import build
    from opd.runner import Runner, RunnerLimits
    from opd.tracking.traces import Tracer

    model = build.resolve_model(cfg.server.model)
    env = build.environment(cfg, build.load_data(cfg), model, build.server_pool(cfg, model, [url]), Tracer.off())
    await env.setup()
    groups = build.groups_in_flight(cfg, 1)
    sinks = build.sinks(cfg, env, model, [url], None, groups * cfg.group_size)
    trainer, evaluator = sinks[-2], sinks[-1]
    train_spans: list[tuple[float, float]] = []
    eval_spans: list[tuple[float, float]] = []
    _timed(trainer, "update", train_spans)
    _timed(evaluator, "run", eval_spans)
    started = time.monotonic()
    try:
        for sink in sinks:
            await sink.open()
        await Runner(env, sinks, cfg.total_steps, RunnerLimits(groups, 2, 20), progress=False).run()
    finally:
        for sink in sinks:
            await sink.close("FINISHED")
        await env.close()
    return {"wall_s": time.monotonic() - started, "train": train_spans, "eval": eval_spans, "trainer_steps": trainer.steps, "steps": trainer.history}


def bench_loop(repeats: int, base_url: str | None = None, env: str = "inline_math", overrides: tuple[str, ...] = ()) -> Iterator[dict[str, Any]]:
    """A closed loop of 2 trainer steps of 8 groups x 8 rollouts with an evaluation after each, on
    vLLM with the fixture model (the embedded server with dev routes, or `base_url`, which must be
    started with VLLM_SERVER_DEV_MODE=1). Reports per iteration the seconds spent generating,
    training (the optimiser step and the save), refreshing the served weights and evaluating, and
    the share of the trainer's time during which vLLM ran no request."""
    from opd.event_loop import run_loop
    from opd.fixture.build import ensure_fixture

    with tempfile.TemporaryDirectory() as tmp:
        server = embedded_vllm(Path(tmp), ["trainer=local"]) if base_url is None else None
        with server if server is not None else contextlib.nullcontext():
            url = server.base_url if server is not None else base_url
            for r in range(repeats):
                cfg = compose([
                    f"env={env}", "server=vllm", f"server.model={ensure_fixture()}", f"server.base_urls=[{url}]", "trainer=local",
                    "trainer.batch_groups=8", "group_size=8", "total_steps=16", "eval.every=8", "eval.samples_per_item=2",
                    "eval.max_items=20", f"output_dir={tmp}/run{r}",
                ], overrides)
                with MetricsSampler(url.removesuffix("/v1") + "/metrics").running() as sampler:
                    run = run_loop(_loop(cfg, url, Path(tmp) / f"run{r}"), cfg.runner.uvloop)
                train, evals = run["train"], run["eval"]
                train_s = sum(end - start for start, end in train)
                eval_s = sum(end - start for start, end in evals)
                idle = [s.running == 0 for start, end in train for s in sampler.samples if start <= s.at <= end]
                yield {
                    "bench": "loop", "env": env, "iterations": run["trainer_steps"], "groups_per_iteration": 8, "group_size": 8,
                    "wall_s": run["wall_s"], "generate_s_per_iteration": (run["wall_s"] - train_s - eval_s) / max(1, len(train)),
                    "train_and_refresh_s_per_iteration": train_s / max(1, len(train)),
                    "optimiser_step_s": statistics.fmean(m["trainer/step_s"] for m in run["steps"]) if run["steps"] else float("nan"),
                    "refresh_s": statistics.fmean(m["trainer/refresh_s"] for m in run["steps"]) if run["steps"] else float("nan"),
                    "eval_s_per_evaluation": eval_s / max(1, len(evals)),
                    "server_idle_while_training": statistics.fmean(idle) if idle else float("nan"),
                    "metrics_samples": len(sampler.samples),
                }
