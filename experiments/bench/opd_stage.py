"""The OPD stage: judging and teacher scoring of one group's turn pairs, concurrent vs sequential."""

from __future__ import annotations

from typing import Any, Iterator

from experiments.bench.common import FIXTURE, compose, environment, median, scripted_server


def bench_opd(repeats: int, latency_s: float = 0.05, overrides: tuple[str, ...] = ()) -> Iterator[dict[str, Any]]:
    """OPD stage wall time for a group of 4 x 6 turn pairs, 3 judge votes: the project's
    concurrency vs strictly sequential (env.opd.max_concurrency=1), same server limits."""
    from opd.event_loop import run_loop

    with scripted_server(latency_s) as url:
        results: dict[int, list[float]] = {}
        pairs = 0
        for concurrency in (32, 1):
            cfg = compose([
                "env=opd_coding", "server=vllm", f"server.model={FIXTURE}", f"server.base_urls=[{url}]",
                "group_size=4", "env.max_turns=6", "judge_votes=3", f"env.opd.max_concurrency={concurrency}", "distill_topk=20",
            ], overrides)
            env = environment(cfg, url)

            async def groups() -> list[dict[str, Any]]:
                await env.setup()
                try:
                    return [(await env.collect_trajectories(await env.get_next_item()))[0] for _ in range(repeats)]
                finally:
                    await env.close()

            done = run_loop(groups(), cfg.runner.uvloop)
            results[concurrency] = [group["group_overrides"]["opd_wall_s"] for group in done]
            pairs = sum(len(o["opd_turns"]) for o in done[-1]["overrides"])
        seq, conc = median(results[1]), median(results[32])
        yield {
            "bench": "opd", "latency_s": latency_s, "turn_pairs": pairs, "votes": 3,
            "sequential_s": seq, "concurrent_s": conc, "speedup": seq / conc,
            "sequential_runs": results[1], "concurrent_runs": results[32],
            "requests_sequential_floor_s": 2 * pairs * latency_s,
        }
