"""Benchmarks: `python -m experiments.bench <name> [--repeats N]`, names: overhead, opd, records,
startup, e2e, tools, loop, viewer, teacher, all; and `compare --root DIR`, the overhead bench of this
checkout and of DIR side by side.

Each result is one JSON line on stdout, also appended to outputs/bench/<name>.jsonl with the time,
git commit and host. These machines are noisy: every ratio is measured within one run, repeated,
and reported as the median with the individual values.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from experiments.bench.common import ROOT  # noqa: E402
from experiments.bench.side_by_side import bench_compare  # noqa: E402
from experiments.bench.e2e import bench_e2e  # noqa: E402
from experiments.bench.loop import bench_loop  # noqa: E402
from experiments.bench.opd_stage import bench_opd  # noqa: E402
from experiments.bench.overhead import bench_overhead  # noqa: E402
from experiments.bench.records import bench_records  # noqa: E402
from experiments.bench.startup import bench_startup  # noqa: E402
from experiments.bench.teacher import bench_teacher  # noqa: E402
from experiments.bench.tools import bench_tools  # noqa: E402
from experiments.bench.viewer import bench_viewer  # noqa: E402

BENCHES: dict[str, Callable[..., Iterator[dict[str, Any]]]] = {
    "overhead": bench_overhead, "opd": bench_opd, "records": bench_records, "startup": bench_startup,
    "e2e": bench_e2e, "tools": bench_tools, "loop": bench_loop, "viewer": bench_viewer, "teacher": bench_teacher,
}


def _context() -> dict[str, str]:
    from opd.tracking.mlflow_run import git_commit

    return {"at": time.strftime("%Y-%m-%dT%H:%M:%S"), "git_commit": git_commit(ROOT)[:12], "host": platform.node(), "cpus": str(os.cpu_count())}


def preflight(args: argparse.Namespace) -> None:
    """What the benches are given, checked before any of them starts: the `--set` overrides compose
    and validate, `--url` answers, `--root` is a checkout; a ConfigError naming the option
    otherwise."""
    from opd.cli import user_error
    from opd.config import ConfigError, compose, validate
    from opd.serving.watch import check_servers

    if args.set:
        try:
            validate(compose(["tracking.enabled=false", *args.set]))
        except ConfigError as err:
            raise ConfigError(f"--set: {err}", "--set") from None
        except Exception as err:  # noqa: BLE001 - Hydra's errors for what was typed become one line; others are raised
            line = user_error(err, list(args.set))
            if line is None:
                raise
            raise ConfigError(f"--set {line}", "--set") from None
    if args.url:
        check_servers([args.url], None, "--url", "--url")
    if not (args.root / "experiments" / "launch.py").is_file():
        raise ConfigError(f"--root={str(args.root)!r}: not a checkout of this project (no experiments/launch.py there)", "--root")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.bench", description=__doc__.split("\n")[0])
    parser.add_argument("name", choices=[*BENCHES, "all", "compare"])
    parser.add_argument("--repeats", type=int, default=3, help="measurements per point (the median is reported)")
    parser.add_argument("--embedded", action="store_true", help="startup: also time the embedded vLLM server cold and warm")
    parser.add_argument("--url", help="e2e: a running vLLM server's /v1 URL serving the fixture model, instead of starting one (two checkouts can then share it)")
    parser.add_argument("--root", type=Path, default=ROOT,
                        help="startup: the checkout whose launcher is timed; compare: the other checkout (a worktree of another commit gives a before/after)")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "bench")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a Hydra override for every run's config, e.g. runner.oversubscribe=2")
    parser.add_argument("--workers", default="1", help="overhead, compare: environment processes to compare, e.g. 1,2 (above 1 on a local Ray cluster)")
    parser.add_argument("--latency", type=float, action="append", help="overhead, compare: seconds per request (repeatable; default 0.1 and 1)")
    parser.add_argument("--in-flight", type=int, action="append", help="overhead, compare: request limits (repeatable; default 1, 8, 32, 128)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from opd.cli import fail
    from opd.config import ConfigError

    try:
        preflight(args)
    except ConfigError as err:
        fail(str(err))
    args.out.mkdir(parents=True, exist_ok=True)
    context = {**_context(), **({"overrides": " ".join(args.set)} if args.set else {})}
    if args.name == "startup" and args.root.resolve() != ROOT:
        from opd.tracking.mlflow_run import git_commit

        context["timed_commit"] = git_commit(args.root)[:12]
    benches = {**BENCHES, "compare": bench_compare}
    for name in (list(BENCHES) if args.name == "all" else [args.name]):
        kwargs: dict[str, Any] = {"embedded": args.embedded, "root": args.root.resolve()} if name == "startup" else {}
        if name == "compare":
            kwargs["root"] = args.root.resolve()
        if name in ("e2e", "teacher") and args.url:
            kwargs["base_url"] = args.url
        if name in ("overhead", "compare"):
            kwargs["workers"] = tuple(int(w) for w in args.workers.split(","))
            if args.latency:
                kwargs["latencies"] = tuple(args.latency)
            if args.in_flight:
                kwargs["limits"] = tuple(args.in_flight)
        with open(args.out / f"{name}.jsonl", "a", encoding="utf-8") as log:
            for result in benches[name](args.repeats, overrides=tuple(args.set), **kwargs):
                line = json.dumps({**result, **context}, default=float)
                sys.stdout.write(line + "\n")
                sys.stdout.flush()
                log.write(line + "\n")
    return 0

