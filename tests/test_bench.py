"""The benchmark command: each bench runs end to end (small sizes) and reports what it claims."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT
from helpers import launch
from experiments.bench import bench_e2e, bench_opd, bench_overhead, bench_records


def test_records_bench_writes_and_reads_back_both_encodings() -> None:
    results = list(bench_records(1, k=8, sizes=(256, 512)))
    assert [(r["tokens_per_sequence"], r["encoding"]) for r in results] == [(256, "jsonl"), (256, "gzip"), (512, "jsonl"), (512, "gzip")]
    plain = {r["tokens_per_sequence"]: r["bytes"] for r in results if r["encoding"] == "jsonl"}
    packed = {r["tokens_per_sequence"]: r["bytes"] for r in results if r["encoding"] == "gzip"}
    assert 1.8 < plain[512] / plain[256] < 2.2  # linear in tokens
    assert all(packed[n] < plain[n] for n in plain)
    assert all(r["peak_mib"] > 0 and r["write_s"] > 0 for r in results)


@pytest.mark.slow
def test_overhead_bench_drives_the_real_stack_against_the_scripted_server() -> None:
    (result,) = bench_overhead(1, latencies=(0.05,), limits=(4,))
    assert result["in_flight"] == 4 and result["rollouts"] == 40
    assert 0.2 < result["fraction_of_ideal"] <= 1.05 and 0.2 < result["bare_client_fraction_of_ideal"] <= 1.05
    assert result["fraction_of_bare_client"] == pytest.approx(result["fraction_of_ideal"] / result["bare_client_fraction_of_ideal"])
    assert result["env_cpu_ms_per_rollout"] > 0 and result["event_loop"] == "uvloop"
    # Where a rollout's time went: the request is most of it, and the phases add up to the total.
    spent = result["latency_ms"]
    assert 45 <= spent["request"] <= spent["total"] and {"slot", "prompt", "reward", "check", "sinks"} <= set(spent)
    top_level = sum(ms for name, ms in spent.items() if "/" not in name and name != "total")
    assert top_level == pytest.approx(spent["total"], abs=0.1) and result["bare_client_request_ms"] >= 45
    # Closing the env (once per run) is timed apart from the rate, as the bare client's session close is.
    assert result["close_ms"] > 0


@pytest.mark.slow
def test_e2e_bench_reads_the_servers_running_requests(vllm_url: str) -> None:
    (result,) = bench_e2e(1, limit=4, base_url=vllm_url, runs=(("inline_math", 4, ("env.max_tool_calls=1",)),))
    assert result["env"] == "inline_math" and result["in_flight_limit"] == 4 and result["groups"] == 4
    assert result["groups_in_flight"] == 2  # 4 slots x 1.5 / group_size 4, rounded up
    # vLLM's own gauge saw requests running, never more than the limit on average.
    assert 0 < result["mean_running_while_work"] <= 4 and result["mean_running_whole_run"] > 0
    assert result["groups_per_min"] > 0 and result["metrics_samples"] > 0 and result["metrics_samples_missed"] == 0


@pytest.mark.slow
def test_opd_bench_compares_concurrent_with_sequential() -> None:
    (result,) = bench_opd(1, latency_s=0.05)
    assert result["turn_pairs"] == 24  # 4 sequences x 6 turn pairs
    assert result["speedup"] > 1.5 and result["sequential_s"] >= result["requests_sequential_floor_s"]


def test_cli_prints_json_lines_and_keeps_them(tmp_path) -> None:
    proc = subprocess.run([sys.executable, "-c", "import experiments.bench as b; b.BENCHES['records'] = lambda r, **kw: b.bench_records(r, k=4, sizes=(64,)); raise SystemExit(b.main(['records', '--repeats', '1', '--out', %r]))" % str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(lines) == 2 and all(line["bench"] == "records" and line["git_commit"] for line in lines)
    assert (tmp_path / "records.jsonl").read_text().count("\n") == 2


@pytest.mark.slow
def test_http_5xx_is_retried_with_backoff_and_counted(tmp_path) -> None:
    import mlflow

    from experiments.bench import scripted_server

    with scripted_server(0.01, fail_every=3) as url:
        launch(tmp_path, ROOT / "opd/fixture/model", url, ["env=inline_math", "total_steps=4", "group_size=2"])
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("inline_math").experiment_id])
    assert run.info.status == "FINISHED" and run.data.metrics["summary/groups_written"] == 4
    # 1 in 3 answered 503, each retried and then answered: retries, not errors (errors are requests
    # that failed for good).
    assert run.data.metrics["summary/server_request_retries"] >= 2
    assert run.data.metrics["summary/server_request_errors"] == 0


@pytest.mark.slow
def test_slow_responses_time_out_per_request_and_the_run_ends_instead_of_hanging(tmp_path) -> None:
    import time

    from experiments.bench import scripted_server
    from opd.runner import TooManyFailures

    started = time.monotonic()
    with scripted_server(5.0) as url, pytest.raises(TooManyFailures, match="groups failed") as info:
        launch(tmp_path, ROOT / "opd/fixture/model", url, ["env=inline_math", "total_steps=2", "group_size=1", "server.request_timeout_s=1", "runner.max_failed_groups=1",
                                        "runner.groups_in_flight=1", "runner.max_attempts_per_item=1"])
    assert "timed out after 1 s" in str(info.value.__cause__)
    assert time.monotonic() - started < 120


def test_compare_alternates_the_checkouts_and_reports_the_ratio_per_point(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Each point is run by both checkouts in turn (this, other, other, this: drifting load falls
    on both), and the ratio pairs runs that were next to each other."""
    from experiments.bench import side_by_side

    calls: list[tuple[str, float, int]] = []
    speed = {str(ROOT): [100.0, 90.0, 120.0], str(tmp_path): [50.0, 60.0, 40.0]}

    def fake_run(checkout, latency_s, in_flight, workers, overrides):
        calls.append((str(checkout), latency_s, in_flight))
        rate = speed[str(checkout)][sum(c[0] == str(checkout) and c[1:] == (latency_s, in_flight) for c in calls) - 1]
        return {"rollouts_per_s": rate, "fraction_of_ideal": rate / 200, "fraction_of_bare_client": rate / 180, "latency_ms": {"request": 100.0, "total": 1000 / rate}}

    monkeypatch.setattr(side_by_side, "overhead_run", fake_run)
    results = list(side_by_side.bench_compare(3, tmp_path, latencies=(0.1,), limits=(1, 8)))
    assert [(r["latency_s"], r["in_flight"]) for r in results] == [(0.1, 1), (0.1, 8)]
    this, other = str(ROOT), str(tmp_path)
    assert [c[0] for c in calls[:6]] == [this, other, other, this, this, other]
    (first, _) = results
    assert first["ratio_runs"] == [2.0, 1.5, 3.0] and first["ratio"] == 2.0
    assert first["this_rollouts_per_s"] == 100.0 and first["other_rollouts_per_s"] == 50.0
    assert first["this_latency_ms"] == {"request": 100.0, "total": 10.0}


@pytest.mark.slow
def test_compare_runs_each_checkouts_own_bench(tmp_path) -> None:
    """Against this same checkout (an A/A run): one real overhead run a side, a ratio near 1 (the
    alternation over repeats is test_compare_alternates_the_checkouts_and_reports_the_ratio_per_point)."""
    proc = subprocess.run([sys.executable, "-m", "experiments.bench", "compare", "--root", str(ROOT), "--latency", "0.05", "--in-flight", "2",
                           "--repeats", "1", "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (line,) = [json.loads(line) for line in proc.stdout.splitlines()]
    assert line["bench"] == "compare" and line["other_commit"] == line["git_commit"] and len(line["ratio_runs"]) == 1
    assert 0.5 < line["ratio"] < 2 and line["this_latency_ms"]["request"] >= 45
    assert (tmp_path / "compare.jsonl").read_text().count("\n") == 1
