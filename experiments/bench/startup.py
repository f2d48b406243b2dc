"""Start-up: from the command to the first request, and the embedded server's time to healthy."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

from experiments.bench.common import FIXTURE, ROOT, embedded_vllm, get_json, median, scripted_server


def bench_startup(repeats: int, embedded: bool = False, overrides: tuple[str, ...] = (), root: Path = ROOT) -> Iterator[dict[str, Any]]:
    """Command to first request: a launcher subprocess (of the checkout `root`) against the
    scripted server (imports, config, dataset, env), with and without MLflow (a new sqlite store,
    artifacts in the same temporary directory); with MLflow also when its run was created and
    how long before the first request that was (`run_created_to_first_request_s`; negative: the
    first request went out before the run was created). Optionally the embedded server cold and
    warm."""
    with scripted_server(0.01) as url:
        for tracking in (False, True):
            first, opened, ended = [], [], []
            for _ in range(repeats):
                with tempfile.TemporaryDirectory() as tmp:
                    urllib.request.urlopen(urllib.request.Request(url.removesuffix("/v1") + "/reset", method="POST"), timeout=10)
                    started = time.time()
                    subprocess.run([
                        sys.executable, "-m", "experiments.launch", "env=inline_math", "server=vllm", f"server.model={FIXTURE}",
                        f"server.base_urls=[{url}]", "total_steps=1", "group_size=1", "runner.progress=false", f"tracking.enabled={str(tracking).lower()}",
                        f"tracking.uri=sqlite:///{tmp}/mlflow.db", f"tracking.artifact_root={tmp}/mlruns", f"hydra.run.dir={tmp}/run", *overrides,
                    ], cwd=root, check=True, capture_output=True)
                    ended.append(time.time() - started)
                    first.append(get_json(url.removesuffix("/v1") + "/stats")["first_request_at"] - started)
                    if tracking:
                        opened.append(_run_started_at(f"sqlite:///{tmp}/mlflow.db") - started)
            result: dict[str, Any] = {"bench": "startup", "server": "running (server=vllm)", "tracking": tracking,
                                      "to_first_request_s": median(first), "runs": [round(t, 2) for t in first], "command_s": median(ended)}
            if tracking:
                result["mlflow_run_created_s"] = median(opened)
                result["run_created_to_first_request_s"] = median([f - o for f, o in zip(first, opened)])
            yield result
    if embedded:
        with tempfile.TemporaryDirectory() as tmp:
            for state in ("cold", "warm"):
                with embedded_vllm(Path(tmp)) as server:
                    yield {"bench": "startup", "server": f"embedded vLLM, {state} compile cache", "to_healthy_s": server.startup_seconds}


def _run_started_at(uri: str) -> float:
    """When the one run in the store was created (epoch seconds)."""
    import mlflow

    client = mlflow.MlflowClient(uri)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return run.info.start_time / 1000
