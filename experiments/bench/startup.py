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


def bench_startup(repeats: int, embedded: bool = False, overrides: tuple[str, ...] = ()) -> Iterator[dict[str, Any]]:
    """Command to first request: a launcher subprocess against the scripted server (imports,
    config, dataset, env), with and without MLflow; optionally the embedded server cold and warm."""
    with scripted_server(0.01) as url:
        for tracking in (False, True):
            times = []
            for _ in range(repeats):
                with tempfile.TemporaryDirectory() as tmp:
                    urllib.request.urlopen(urllib.request.Request(url.removesuffix("/v1") + "/reset", method="POST"), timeout=10)
                    started = time.time()
                    subprocess.run([
                        sys.executable, "-m", "experiments.launch", "env=inline_math", "server=vllm", f"server.model={FIXTURE}",
                        f"server.base_urls=[{url}]", "total_steps=1", "group_size=1", "runner.progress=false", f"tracking.enabled={str(tracking).lower()}",
                        f"tracking.uri=sqlite:///{tmp}/mlflow.db", f"tracking.artifact_root={tmp}/mlruns", f"hydra.run.dir={tmp}/run",
                    ], cwd=ROOT, check=True, capture_output=True)
                    first = get_json(url.removesuffix("/v1") + "/stats")["first_request_at"]
                    times.append(first - started)
            yield {"bench": "startup", "server": "running (server=vllm)", "tracking": tracking, "to_first_request_s": median(times), "runs": [round(t, 2) for t in times]}
    if embedded:
        with tempfile.TemporaryDirectory() as tmp:
            for state in ("cold", "warm"):
                with embedded_vllm(Path(tmp)) as server:
                    yield {"bench": "startup", "server": f"embedded vLLM, {state} compile cache", "to_healthy_s": server.startup_seconds}
