"""Run vLLM's OpenAI server as a child process for the length of a run.

The server listens on a free loopback port; its log and caches go to a folder of the run (never
~/.cache: only vLLM's facts about model classes are kept between runs, opd/serving/modelinfos.py),
its IPC sockets to a short private temporary directory removed when it stops. The
user's hub settings (HF_HUB_OFFLINE, HF_HOME, HF_TOKEN) pass through unchanged, and the model's own
generation_config.json gives the sampling defaults a request does not set (vLLM's
`--generation-config auto`). `LocalVLLM` is a context manager that always stops the process
(normal end, exception, Ctrl-C), killing its whole process group if it does not exit in time.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from opd.config import LocalServerConfig, project_path
from opd.run_files import make_dir, open_file
from opd.serving import modelinfos

logger = logging.getLogger(__name__)


# Seconds an idle connection is kept by a server the run starts beyond the client's keepalive_s: the
# client closes it first however busy its event loop is (vLLM's own default, 5 s, was below the
# client's 15 s: a request reused a connection the server had just closed, "Can not write request body").
SERVER_KEEPALIVE_MARGIN_S = 60


def server_keepalive_s(client_keepalive_s: float) -> int:
    """VLLM_HTTP_TIMEOUT_KEEP_ALIVE (whole seconds) of a server whose client keeps idle connections
    for `client_keepalive_s`."""
    return math.ceil(client_keepalive_s) + SERVER_KEEPALIVE_MARGIN_S


class ServerStartError(RuntimeError):
    """The local server did not become healthy; the message points at its log."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _healthy(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


# What vLLM is doing while it starts, by the last of these lines its log holds (in start-up order).
_PHASES = (
    ("(APIServer", "loading its modules and the model's config"),
    ("Resolved architecture", "setting up the engine"),
    ("(EngineCore", "starting the engine process"),
    ("Starting to load model", "loading the weights"),
    ("Loading weights took", "allocating the KV cache"),
    ("init engine", "starting the HTTP server"),
    ("Starting vLLM API server", "opening the port"),
)


def startup_phase(log_text: str) -> str:
    """What a starting vLLM server is doing, from its log so far: the furthest step its log has
    reached (its imports come first; the API server keeps logging through every later step)."""
    reached = [phase for marker, phase in _PHASES if marker in log_text]
    return reached[-1] if reached else "importing vLLM"


def _read_tail(path: Path, size: int = 1 << 16) -> str:
    try:
        with open_file(path, "rb") as handle:
            handle.seek(max(0, os.fstat(handle.fileno()).st_size - size))
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


def _log_tail(path: Path, lines: int = 15) -> str:
    return "\n".join(_read_tail(path).splitlines()[-lines:]) or "(no log)"


class LocalVLLM:
    """Start, wait for and stop one vLLM OpenAI server on loopback."""

    def __init__(self, settings: LocalServerConfig, model: str, workdir: Path, seed: int = 0, weights: str | None = None) -> None:
        """`settings` is the run's server=local config; `model` the resolved model directory or hub
        name (served under that name); `weights` another directory to load it from (an untied copy,
        opd.train.untied); the log and caches go to `workdir`."""
        self.settings = settings
        self.model = model
        self.weights = weights or model
        self.workdir = workdir
        self.seed = seed
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.log_path = workdir / "server.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.startup_seconds: float | None = None
        self.scratch = tempfile.mkdtemp(prefix="opd-vllm-")
        # Seconds between the lines that say how the start-up goes (it takes a minute or two on CPU).
        self.progress_every_s = 15.0

    def command(self) -> list[str]:
        s = self.settings
        cmd = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.weights,
            "--served-model-name", self.model,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--dtype", s.dtype,
            "--max-model-len", str(s.max_model_len),
            "--max-logprobs", str(s.max_logprobs),
            "--seed", str(self.seed),
            "--disable-uvicorn-access-log",
        ]
        if s.tool_call_parser:
            cmd += ["--enable-auto-tool-choice", "--tool-call-parser", s.tool_call_parser]
        if s.chat_template:
            cmd += ["--chat-template", str(project_path(s.chat_template).resolve())]
        if s.reasoning_parser:
            cmd += ["--reasoning-parser", s.reasoning_parser]
        if s.enforce_eager:
            cmd.append("--enforce-eager")
        return cmd + list(s.extra_args)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "VLLM_CPU_KVCACHE_SPACE": str(self.settings.cpu_kv_cache_gib),
                "VLLM_CACHE_ROOT": str(self.workdir / "cache"),
                # IPC sockets and scratch files: a short private directory (a unix socket path
                # must fit in 107 bytes, which a deep run directory exceeds); removed at stop.
                "VLLM_RPC_BASE_PATH": self.scratch,
                "TMPDIR": self.scratch,
                "VLLM_NO_USAGE_STATS": "1",
                "DO_NOT_TRACK": "1",
                # Idle connections: the server keeps one SERVER_KEEPALIVE_MARGIN_S longer than the
                # client reuses it (server.keepalive_s), so the client always closes it first.
                "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": str(server_keepalive_s(self.settings.keepalive_s)),
                **self.settings.environment,
            }
        )
        return env

    def start(self) -> str:
        """Start the server and wait for /health; return the /v1 base URL."""
        cache = make_dir(make_dir(self.workdir) / "cache")  # in the run directory: directories of their own, not links
        own_cache = Path(self.environment()["VLLM_CACHE_ROOT"]) == cache  # not one the user set (server.environment)
        if own_cache:
            modelinfos.seed(cache)
        started = time.monotonic()
        logger.info("starting vLLM on port %d (log: %s)", self.port, self.log_path)
        with open_file(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("guard.py")), *self.command()],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.environment(), start_new_session=True,
            )
        health = f"http://127.0.0.1:{self.port}/health"
        deadline = started + self.settings.startup_timeout_s
        said = started
        while time.monotonic() < deadline:
            if time.monotonic() - said >= self.progress_every_s:
                said = time.monotonic()
                logger.info("vLLM starting: %.0f s, %s (log: %s)", said - started, startup_phase(_read_tail(self.log_path)), self.log_path)
            code = self.process.poll()
            if code is not None:
                self.stop()
                raise ServerStartError(
                    f"vLLM exited with code {code} while starting; see {self.log_path}:\n{_log_tail(self.log_path)}"
                )
            if _healthy(health):
                self.startup_seconds = time.monotonic() - started
                logger.info("vLLM healthy after %.1f s at %s", self.startup_seconds, self.base_url)
                if own_cache:
                    modelinfos.keep(cache)
                return self.base_url
            time.sleep(0.5)
        self.stop()
        raise ServerStartError(
            f"vLLM was not healthy after {self.settings.startup_timeout_s:g} s (server.startup_timeout_s); "
            f"see {self.log_path}:\n{_log_tail(self.log_path)}"
        )

    def stop(self, grace_s: float = 15.0) -> None:
        """Stop the server's process group: SIGTERM, then SIGKILL after `grace_s`."""
        process, self.process = self.process, None
        if process is None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            return
        # The leader stays an unreaped child until the group is killed: its pid, and so the group,
        # cannot be another process's meanwhile.
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            if not _exited_unreaped(process.pid, grace_s):
                logger.warning("vLLM did not stop within %.0f s; killing it", grace_s)
        # Children (engine core, workers) share the group; make sure none is left. (A leader
        # already reaped, e.g. by a health check: its group lives on while a child does.)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        shutil.rmtree(self.scratch, ignore_errors=True)
        logger.info("vLLM stopped")

    def restart(self) -> str:
        """Stop whatever is left of the server and start it again on the same port."""
        self.stop()
        os.makedirs(self.scratch, mode=0o700, exist_ok=True)
        return self.start()

    def __enter__(self) -> "LocalVLLM":
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def _exited_unreaped(pid: int, timeout_s: float) -> bool:
    """Wait up to `timeout_s` for child `pid` to exit, leaving it unreaped; whether it did."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
