"""What several test modules share: a run pointed at a server with its own MLflow store, that
run's MLflow record, a server process (`mlflow server`, `mlflow ui`, ...) on a free port, a counting
proxy, and hand-built records."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

from conftest import ROOT, compose
from opd.records import DISTILL_PAD_ID, MASK, MASKED_LOGPROB, check_group
from opd.serving.local_vllm import free_port

__all__ = ["Proxy", "free_port", "run_args", "launch", "launch_process", "mlflow_run", "lines", "serving", "mlflow_serving", "sequence", "make_group",
           "assert_taught"]


# ---------------------------------------------------------------- runs

def run_args(tmp_path: Path, model: str | Path, url: str) -> list[str]:
    """Overrides that point a run at `url` (serving `model`) and keep its MLflow store in `tmp_path`."""
    return [
        "server=vllm", f"server.model={model}", f"server.base_urls=[{url}]", "runner.progress=false",
        f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", f"tracking.artifact_root={tmp_path / 'mlruns'}",
    ]


def launch(tmp_path: Path, model: str | Path, url: str, overrides: list[str]) -> float:
    """A run in this process with its output in `tmp_path/run` (`overrides` last); its objective."""
    from experiments.launch import launch as run

    return run(compose([*run_args(tmp_path, model, url), f"output_dir={tmp_path / 'run'}", *overrides]))


def launch_process(tmp_path: Path, model: str | Path, url: str, overrides: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    """`python -m experiments.launch` in its own process, output in `tmp_path/run`, stderr appended to
    `tmp_path/stderr.log`; `env` is its whole environment (default: this one, offline)."""
    env = env if env is not None else {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    cmd = [sys.executable, "-m", "experiments.launch", *run_args(tmp_path, model, url), f"hydra.run.dir={tmp_path / 'run'}", *overrides]
    with (tmp_path / "stderr.log").open("a") as stderr:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=stderr)


def mlflow_run(tmp_path: Path, experiment: str = "inline_math"):
    """(client, run): the one MLflow run of `experiment` in the store `run_args` put in `tmp_path`."""
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert len(runs) == 1, [r.info.run_name for r in runs]
    return client, runs[0]


def lines(path: Path) -> int:
    """Complete lines in `path` so far (0 before it exists)."""
    return path.read_bytes().count(b"\n") if path.exists() else 0


# ---------------------------------------------------------------- a real server process

@contextlib.contextmanager
def serving(program: list[str], workdir: Path, ready_path: str = "/", timeout_s: float = 240, env: dict[str, str] | None = None) -> Iterator[str]:
    """`program --host 127.0.0.1 --port PORT` on a free port, run in `workdir` with its output in
    `workdir/server.log`; yields its URL once `ready_path` answers. Its whole process group is
    stopped afterwards."""
    port = free_port()
    log = (workdir / "server.log").open("w")
    proc = subprocess.Popen([*program, "--host", "127.0.0.1", "--port", str(port)], cwd=workdir, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                urllib.request.urlopen(url + ready_path, timeout=2).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, (workdir / "server.log").read_text()[-3000:]
                time.sleep(0.25)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def mlflow_serving(command: list[str], workdir: Path) -> contextlib.AbstractContextManager[str]:
    """`mlflow <command>` (`server ...` or `ui ...`) as `serving` runs it, ready once /health answers."""
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    return serving([str(Path(sys.executable).parent / "mlflow"), *command], workdir, "/health", env=env)


# ---------------------------------------------------------------- a proxy in front of a server

class Proxy:
    """A TCP proxy on loopback in front of a server; `down()` cuts it (listener and connections).
    `requests` counts the HTTP POSTs sent through it (a second URL for one server, told apart)."""

    def __init__(self, target: str) -> None:
        self.target_port = int(target.rsplit(":", 1)[1].split("/", 1)[0])
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.requests = 0
        self.loop = asyncio.new_event_loop()
        self.server: asyncio.AbstractServer | None = None
        self.writers: set[asyncio.StreamWriter] = set()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.up()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, count: bool = False) -> None:
        tail = b""  # a request line split across two reads is still counted once
        try:
            while data := await reader.read(65536):
                if count:  # the tail is one byte shorter than b"POST /": never counted twice
                    self.requests += (tail + data).count(b"POST /")
                    tail = (tail + data)[-5:]
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.writers |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer, count=True), self._pipe(up_reader, writer))

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=10)

    def up(self) -> None:
        async def start() -> None:
            self.server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, reuse_address=True)
        self._call(start())

    def down(self) -> None:
        async def stop() -> None:
            assert self.server is not None
            self.server.close()
            for writer in list(self.writers):
                writer.close()
            self.writers.clear()
            await self.server.wait_closed()
        self._call(stop())

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)


# ---------------------------------------------------------------- hand-built records

def sequence(prompt: list[int], generated: list[int], lp: float | list[float] = -1.0) -> tuple[list[int], list[int], list[float]]:
    """(tokens, masks, inference_logprobs) of one rollout: `prompt` masked, then `generated` sampled
    at `lp` (one value for every token, or one per token)."""
    lps = lp if isinstance(lp, list) else [lp] * len(generated)
    assert len(lps) == len(generated)
    return prompt + generated, [MASK] * len(prompt) + generated, [MASKED_LOGPROB] * len(prompt) + lps


def make_group(rollouts: list[tuple[list[int], list[int], list[float]]], scores: list[float], **fields: Any) -> dict[str, Any]:
    """A group of `rollouts` (from `sequence`) with their `scores`; `fields` add to or replace the
    rest (overrides default to one empty dict a rollout)."""
    return {
        "tokens": [r[0] for r in rollouts], "masks": [r[1] for r in rollouts], "inference_logprobs": [r[2] for r in rollouts],
        "scores": list(scores), "overrides": [{} for _ in rollouts], **fields,
    }


def assert_taught(group: dict[str, Any], topk: int | None = None, teacher: str = "model") -> None:
    """A valid group of the `teacher` kind whose every trained token of every rollout has the
    teacher's row: its logprob of the sampled token and top-K (`topk` entries when given), no pad."""
    assert check_group(group) == [] and group["group_overrides"]["teacher"] == teacher
    for i, masks in enumerate(group["masks"]):
        trained = [p for p, m in enumerate(masks) if m != MASK]
        assert trained and all(group["overrides"][i]["teacher_logprobs"][p] is not None for p in trained)
        assert all(group["distill_token_ids"][i][p][0] != DISTILL_PAD_ID for p in trained)
        assert topk is None or all(len(group["distill_token_ids"][i][p]) == topk for p in trained)
