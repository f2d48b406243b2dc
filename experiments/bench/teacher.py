"""teacher=model's cost: time per inline_math group with and without a teacher model scoring
every sampled token, on the scripted server and on real vLLM (the embedded fixture server, or
`--url`). The teacher scores each rollout as soon as it ends, in its own slots, so the group
should cost about one scoring request more, not one per rollout (`serialised_floor_s`)."""

from __future__ import annotations

import time
from typing import Any, Iterator

from experiments.bench.common import FIXTURE, ROOT, compose, median, scripted_server

GROUP_SIZE = 4


def _per_group_s(url: str, teacher: bool, groups: int, overrides: tuple[str, ...]) -> list[float]:
    """Seconds per group, groups one after another, with or without the teacher (on `url` too)."""
    from opd import build
    from opd.event_loop import run_loop
    from opd.tracking.traces import Tracer

    cfg = compose(["env=inline_math", "server=vllm", f"server.model={FIXTURE}", f"server.base_urls=[{url}]", f"group_size={GROUP_SIZE}",
                   "distill_topk=20", *(["teacher=model", f"teacher.server.model={FIXTURE}", f"teacher.server.base_url={url}"] if teacher else [])],
                  overrides)
    model = build.resolve_model(cfg.server.model)
    taught = build.teacher_model(cfg, model, [url], Tracer.off()) if teacher else None
    env = build.environment(cfg, build.load_data(cfg), model, build.server_pool(cfg, model, [url]), Tracer.off(), None, taught)

    async def run() -> list[float]:
        await env.setup()
        await env.ready()
        times = []
        try:
            for _ in range(groups):
                item = await env.get_next_item()
                started = time.perf_counter()
                group, _ = await env.collect_trajectories(item)
                times.append(time.perf_counter() - started)
                assert (group["group_overrides"].get("teacher") == "model") == teacher
        finally:
            await env.close()
        return times

    return run_loop(run(), cfg.runner.uvloop)


def _compare(server: str, url: str, repeats: int, overrides: tuple[str, ...], **extra: Any) -> dict[str, Any]:
    groups = max(3, repeats)
    _per_group_s(url, False, 1, overrides)  # warm-up: parsers, math-verify's workers, the server's caches
    without, with_teacher = [], []
    for _ in range(max(1, repeats)):  # interleaved, so load changes hit both alike
        without += _per_group_s(url, False, groups, overrides)
        with_teacher += _per_group_s(url, True, groups, overrides)
    plain, taught = median(without), median(with_teacher)
    return {"bench": "teacher", "server": server, "group_size": GROUP_SIZE, "groups": len(without), **extra,
            "per_group_s": plain, "per_group_with_teacher_s": taught, "ratio": taught / plain,
            "runs_s": without, "runs_with_teacher_s": with_teacher}


def bench_teacher(repeats: int, overrides: tuple[str, ...] = (), base_url: str | None = None, latency_s: float = 0.05) -> Iterator[dict[str, Any]]:
    """Per group, with and without the teacher: the scripted server (`latency_s` per request),
    then real vLLM serving the fixture (the teacher on the same server, in its own slots)."""
    with scripted_server(latency_s) as url:
        yield _compare("scripted", url, repeats, overrides, latency_s=latency_s, serialised_floor_s=GROUP_SIZE * latency_s)
    if base_url is not None:
        yield _compare("vllm", base_url, repeats, overrides)
        return
    import tempfile
    from pathlib import Path

    from opd import build
    from opd.config import compose as compose_config
    from opd.config import validate
    from opd.serving.local_vllm import LocalVLLM

    cfg = validate(compose_config(["env=inline_math", f"server.model={FIXTURE}"]))
    (ROOT / "outputs").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="opd-bench-teacher-", dir=ROOT / "outputs") as work:
        with LocalVLLM(cfg.server, build.resolve_model(str(FIXTURE)), Path(work)) as server:
            yield _compare("vllm", server.base_url, repeats, overrides)
