"""Before/after without a timed test: the overhead bench of this checkout and of another one
(`--root`, e.g. `git worktree add /tmp/before main`) side by side in one run.

Each point (seconds per request x requests in flight x `runner.workers`) is measured by both
checkouts' own code, one run each in turn (this, other, other, this, ...: load that comes and
goes falls on both alike), each run a fresh `python -m experiments.bench overhead --repeats 1`
in its checkout. Per point it reports both medians and the ratio of this checkout's rollouts/s to
the other's (median of the per-repeat ratios; above 1: this checkout is faster), so a change that
costs latency shows before it lands.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

from experiments.bench.common import ROOT, median


def overhead_run(checkout: Path, latency_s: float, in_flight: int, workers: int, overrides: tuple[str, ...]) -> dict[str, Any]:
    """One repeat of the overhead bench at one point, by `checkout`'s own code (its last JSON line)."""
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "experiments.bench", "overhead", "--repeats", "1", "--latency", str(latency_s), "--in-flight", str(in_flight),
                   "--workers", str(workers), "--out", out, *(arg for override in overrides for arg in ("--set", override))]
        done = subprocess.run(command, cwd=checkout, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the overhead bench of {checkout} failed (exit {done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_compare(repeats: int, root: Path, latencies: tuple[float, ...] = (0.1, 1.0), limits: tuple[int, ...] = (1, 8, 32, 128),
                  workers: tuple[int, ...] = (1,), overrides: tuple[str, ...] = ()) -> Iterator[dict[str, Any]]:
    """Per point: this checkout's and `root`'s rollouts/s, fraction of ideal and of the bare
    client (medians of `repeats` runs each), and `ratio` = this / other rollouts/s (median of the
    pairs of runs next to each other, with each pair's value in `ratio_runs`)."""
    from opd.tracking.mlflow_run import git_commit

    for latency_s in latencies:
        for limit in limits:
            for count in workers:
                this: list[dict[str, Any]] = []
                other: list[dict[str, Any]] = []
                for r in range(repeats):
                    for checkout, runs in ((ROOT, this), (root, other)) if r % 2 == 0 else ((root, other), (ROOT, this)):
                        runs.append(overhead_run(checkout, latency_s, limit, count, overrides))
                ratios = [a["rollouts_per_s"] / b["rollouts_per_s"] for a, b in zip(this, other)]
                yield {
                    "bench": "compare", "latency_s": latency_s, "in_flight": limit, "workers": count, "other_root": str(root),
                    "other_commit": git_commit(root)[:12], "ratio": median(ratios), "ratio_runs": [round(x, 3) for x in ratios],
                    **{f"{side}_{key}": median([run[key] for run in runs]) for side, runs in (("this", this), ("other", other))
                       for key in ("rollouts_per_s", "fraction_of_ideal", "fraction_of_bare_client")},
                    # Where each checkout's rollouts spent their time (its bench's breakdown, if it has one).
                    "this_latency_ms": latency_medians(this), "other_latency_ms": latency_medians(other),
                }


def latency_medians(runs: list[dict[str, Any]]) -> dict[str, float] | None:
    """The median ms per rollout of each phase over `runs` (None: that bench has no breakdown)."""
    rows = [run["latency_ms"] for run in runs if run.get("latency_ms")]
    if not rows:
        return None
    return {name: round(median([row.get(name, 0.0) for row in rows]), 2) for name in rows[0]}
