"""Benchmarks (`python -m experiments.bench NAME`): one module per bench, shared parts in `common`."""

from experiments.bench.cli import BENCHES, main
from experiments.bench.common import scripted_server
from experiments.bench.e2e import bench_e2e
from experiments.bench.loop import bench_loop
from experiments.bench.opd_stage import bench_opd
from experiments.bench.overhead import bench_overhead
from experiments.bench.records import bench_records
from experiments.bench.startup import bench_startup
from experiments.bench.tools import bench_tools

__all__ = ["BENCHES", "bench_e2e", "bench_loop", "bench_opd", "bench_overhead", "bench_records", "bench_startup", "bench_tools", "main", "scripted_server"]
