"""One MLflow run: opened with its params, tags and dataset input, logged to, and closed.

`tracking.uri` decides where the run goes, its artifacts included (`opd.tracking.store`); the
embedded default is a sqlite store under output_root with artifacts beside it. Params are the
flattened resolved config, each value cut to `max_param_chars` (the whole config is an artifact),
without the directories the run writes to (tags: they differ between runs that ran the same).
Times are the run's own: the MLflow run starts when the run started and ends when it ended, and
each metric carries the time it was logged, however late the tracking process makes the call.
Secrets (API keys, tokens, passwords, credentials in URLs) are masked in every param, tag, run
name, dataset source and config artifact before they leave this process (`opd.tracking.secrets`).
`open_run` is the run's lifetime: the store is checked cheaply before anything starts, the MLflow
calls are made by a process of their own (`Tracker`, `opd.tracking.session`), and the run ends
FINISHED when its block returns, KILLED on Ctrl-C or SIGTERM, FAILED on any other exception. A
sweep job's run is a child of the sweep's parent run; a resumed run continues the MLflow run of
the killed one (its id is kept in the run directory once the run is open).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import logging
import os
import pickle
import queue
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from opd.config import Config, ConfigError
from opd.run_files import read_text, replace_file
from opd.tracking import secrets
from opd.tracking.session import DatasetRef, ensure_experiment, git_commit, system_tags  # noqa: F401 (re-exported)
from opd.tracking.store import absolute_tracking_uri, artifact_location, check_store

logger = logging.getLogger(__name__)
# The tracking process's own output (MLflow's messages), relayed into the run's log.
_process_logger = logging.getLogger("mlflow.process")

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]
# In the run directory: the MLflow run's id (written by the tracking process once the run is
# open) and the tracking process's pid (a resume waits for it to finish).
RUN_FILE = "mlflow_run.json"
PROCESS_FILE = "mlflow_process.pid"


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}, "c": [1, 2]} -> {"a.b": 1, "c": [1, 2]} (lists stay values)."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        out.update(flatten(value, name) if isinstance(value, dict) else {name: value})
    return out


class TrackingFailed(RuntimeError):
    """An MLflow call failed in the tracking process; the run stops instead of going on unlogged."""


class Tracker:
    """One MLflow run (a sweep job's run is nested under the sweep's parent run), logged by a
    process of its own (`python -m opd.tracking.session`), so that no MLflow work (importing it
    alone takes seconds of CPU) delays the run's requests or its event loop.

    Nothing starts before `begin()`: the run calls it when its first requests are on their way
    (or while it waits for a server to start); the process then opens the run and makes the calls
    in the order they were made. Metrics, params, tags and texts are queued; artifacts, tables,
    `run_id` and `experiment_id` wait for their answer. A failed call is raised by the next call
    and returned by `end()`, which waits for every call before the process exits."""

    def __init__(
        self, uri: str, experiment: str, artifact_root: str | None, run_name: str | None, max_param_chars: int,
        parent_run_id: str | None = None, experiment_id: str | None = None, run_id: str | None = None, run_file: Path | None = None,
        started: float | None = None, source: dict[str, str] | None = None,
    ) -> None:
        self.uri = absolute_tracking_uri(uri)
        self.max_param_chars = max_param_chars
        self.params: set[str] = set()
        self._error: BaseException | None = None
        self._outbox: queue.Queue[tuple[str, tuple[Any, ...]] | None] = queue.Queue()
        self._waiting: collections.deque[tuple[str, Future]] = collections.deque()
        # Set when the process has ended: a call sent after that fails at once instead of waiting.
        self._gone: TrackingFailed | None = None
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._threads: list[threading.Thread] = []
        self._traced = False
        os.environ.pop("MLFLOW_RUN_ID", None)  # an inherited id would hijack the run
        location = artifact_location(self.uri, artifact_root)
        self.run_file = run_file
        self.parent_run_id = parent_run_id
        if run_name is not None:  # named after what was asked, which may hold secrets
            run_name = secrets.mask_name(run_name)
        self._opened = self._send("open", self.uri, experiment, location, run_name, parent_run_id, experiment_id, run_id,
                                  None if run_file is None else str(run_file), _ms(started or time.time()), dict(source or {}))

        def opened(future: Future) -> None:
            if future.exception() is None:
                run, exp = future.result()
                logger.info("MLflow run %s in experiment %s (%s)%s", run, exp, self.uri, f", child of {parent_run_id}" if parent_run_id else "")

        self._opened.add_done_callback(opened)

    # ---- the run's side -------------------------------------------------------------------

    def begin(self) -> None:
        """Start the tracking process; it opens the run and makes the queued calls (idempotent)."""
        with self._lock:
            if self._process is not None:
                return
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(_PACKAGE_ROOT), os.environ.get("PYTHONPATH")]))}
            self._process = subprocess.Popen([sys.executable, "-m", "opd.tracking.session"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                             stderr=subprocess.PIPE, env=env)
            if self.run_file is not None:  # a resume waits for it: killed with us, it still sends what it has
                replace_file(self.run_file.with_name(PROCESS_FILE), str(self._process.pid))
            for target in (self._write, self._read, self._relay):
                thread = threading.Thread(target=target, name=f"mlflow-{target.__name__[1:]}", daemon=True)
                thread.start()
                self._threads.append(thread)

    @property
    def run_id(self) -> str:
        self.begin()
        return self._opened.result()[0]

    @property
    def experiment_id(self) -> str:
        self.begin()
        return self._opened.result()[1]

    def for_traces(self) -> str:
        """The experiment id, with the run made active in this process too, so that MLflow links
        the traces made here to it (tracing needs MLflow here; only runs with traces pay that)."""
        import mlflow

        mlflow.set_tracking_uri(self.uri)
        mlflow.start_run(run_id=self.run_id)
        self._traced = True
        return self.experiment_id

    def log_config(self, resolved: dict[str, Any], artifact_file: str = "config.yaml", params: bool = True) -> None:
        """The resolved config, secrets masked: as params (unless `params` is false; the run's
        directories are tags, not params) and as a YAML artifact."""
        masked = secrets.mask_config(resolved)
        if params:
            values = {}
            for key, value in flatten(masked).items():
                if key in DIRECTORY_KEYS:
                    continue
                text = str(value)
                values[key] = text if len(text) <= self.max_param_chars else text[: self.max_param_chars - 3] + "..."
            self.log_params(values)
        from omegaconf import OmegaConf

        self.log_text(OmegaConf.to_yaml(masked), artifact_file)

    def log_params(self, params: dict[str, str]) -> None:
        """Log params not logged yet (MLflow refuses to change a param); secrets masked."""
        items = [(k, v) for k, v in secrets.mask_params(params).items() if k not in self.params]
        self.params.update(k for k, _ in items)
        for start in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
            self._send("log_params", dict(items[start : start + 100]))

    def log_text(self, text: str, artifact_file: str) -> None:
        self._send("log_text", text, artifact_file)

    def set_tags(self, tags: dict[str, str]) -> None:
        """Set tags, secrets masked."""
        self._send("set_tags", secrets.mask_params(dict(tags)))

    def log_dataset(self, name: str, ref: DatasetRef, rows: list[dict[str, Any]], context: str) -> None:
        """The dataset as the run's input: name, digest (of the rows) and source, in the UI's Datasets column
        (a source URL's credentials masked)."""
        ref = DatasetRef(ref.kind, None if ref.path is None else secrets.mask_text(ref.path), ref.subset, ref.split, secrets.mask_text(ref.described))
        self._send("log_dataset", name, ref, rows, context)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Metrics at `step`, stamped with the time of this call."""
        self._send("log_metrics", {k: float(v) for k, v in metrics.items()}, step, _ms(time.time()))

    def log_to_parent(self, metrics: dict[str, float], step: int) -> None:
        """Metrics on the sweep's parent run at `step` (a job's objective at its job number), so the
        parent's charts show the sweep; nothing for a run that is not a sweep job."""
        if self.parent_run_id is not None:
            self._send("log_parent_metrics", self.parent_run_id, {k: float(v) for k, v in metrics.items()}, step, _ms(time.time()))

    def log_artifact(self, path: Path, folder: str | None = None) -> None:
        self._wait("log_artifact", str(Path(path).resolve()), folder)

    def log_artifacts(self, directory: Path, folder: str) -> None:
        self._wait("log_artifacts", str(Path(directory).resolve()), folder)

    def log_table(self, columns: dict[str, list[Any]], artifact_file: str) -> None:
        """A table the UI shows (the run's artifacts and its Evaluation tab)."""
        self._wait("log_table", columns, artifact_file)

    def end(self, status: str) -> BaseException | None:
        """Make every call, end the run `status` (FAILED if its tracking failed), stop the process;
        the first failure, if any."""
        self.begin()
        if self._traced:
            import mlflow

            mlflow.end_run(status=status)
        done = self._send("end", status if self._error is None else "FAILED", _ms(time.time()), check=False)
        self._outbox.put(None)
        with contextlib.suppress(Exception):
            done.result()
        for thread in self._threads:
            thread.join()
        assert self._process is not None
        self._process.wait()
        if self.run_file is not None:  # nothing left for a resume to wait for
            self.run_file.with_name(PROCESS_FILE).unlink(missing_ok=True)
        if done.exception() is None and self._opened.exception() is None:
            logger.info("MLflow run %s ended %s", self._opened.result()[0], status if self._error is None else "FAILED")
        return self._error

    # ---- to and from the tracking process -------------------------------------------------

    def _send(self, name: str, *args: Any, check: bool = True) -> Future:
        if check:
            self._raise_failure()
        future: Future = Future()
        with self._lock:
            if self._gone is not None:
                future.set_exception(self._gone)
                return future
            self._waiting.append((name, future))
            self._outbox.put((name, args))
        return future

    def _wait(self, name: str, *args: Any) -> Any:
        self.begin()
        value = self._send(name, *args).result()
        self._raise_failure()
        return value

    def _raise_failure(self) -> None:
        if isinstance(self._error, ConfigError):  # the store could not be opened after all
            raise self._error
        if self._error is not None:
            raise TrackingFailed(str(self._error)) from self._error

    def _write(self) -> None:
        """Pickle the queued calls into the process (blocking writes happen here, not in the run)."""
        assert self._process is not None and self._process.stdin is not None
        pipe = self._process.stdin
        try:
            while (call := self._outbox.get()) is not None:
                pickle.dump(call, pipe)
                pipe.flush()
        except (BrokenPipeError, OSError):
            pass  # the process is gone; the reader fails what waits
        finally:
            with contextlib.suppress(OSError):
                pipe.close()

    def _relay(self) -> None:
        """The tracking process's own output (MLflow's messages) into this run's log, as the
        logger `mlflow.process`: its INFO lines reach the log file, its warnings the console too."""
        assert self._process is not None and self._process.stderr is not None
        level = logging.INFO
        for raw in self._process.stderr:
            line = raw.decode(errors="replace").rstrip()
            if not line:
                continue
            if not line[0].isspace():  # a new message (an indented line continues the last one)
                level = logging.WARNING if any(w in line for w in ("WARNING", "ERROR", "Traceback", "Error")) else logging.INFO
            _process_logger.log(level, "%s", line)

    def _read(self) -> None:
        """Settle each call with its answer, in order; a failure is kept (the first one)."""
        assert self._process is not None and self._process.stdout is not None
        pipe = self._process.stdout
        while True:
            try:
                answer = pickle.load(pipe)
            except (EOFError, OSError, pickle.UnpicklingError):
                break
            with self._lock:
                name, future = self._waiting.popleft()
            if answer[0] == "ok":
                future.set_result(answer[1])
                if name == "end":
                    break
                continue
            _, text, opening = answer
            error: BaseException = (ConfigError(f"tracking.uri: cannot open the MLflow store {self.uri!r}: {text}", "tracking.uri")
                                    if opening else TrackingFailed(f"MLflow call {name} failed: {text}"))
            if self._error is None:
                self._error = error
                logger.error("MLflow tracking failed: %s", error)
            future.set_exception(error)
        code = self._process.wait()
        with self._lock:  # the process ended: whatever still waits, or is sent later, gets no answer
            lost = list(self._waiting)
            self._waiting.clear()
            self._gone = TrackingFailed(f"the MLflow process exited (code {code}); a call after that has no answer")
        if lost:
            error = TrackingFailed(f"the MLflow process exited (code {code}) before answering {len(lost)} calls")
            self._error = self._error or error
            for _, future in lost:
                future.set_exception(error)


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


# Config keys that say where a run writes: tags of the run, never params.
DIRECTORY_KEYS = ("output_dir", "output_root")
# Overrides that say where or how a run is recorded, or which server does the work, rather than
# what the run does: left out of its name (env and model lead it anyway); keys whose values may be
# secrets are left out too.
_UNNAMED = {"env", "model", "server", "server.model", "server.base_urls", "judge.base_url", "output_root", "output_dir", "resume",
            "runner.progress", "experiment"}
_UNNAMED_PREFIXES = ("hydra.", "hydra/", "tracking.")


# The fixture model's directory (opd/fixture/model), named by path: opd.fixture is a higher layer.
_FIXTURE_DIR = _PACKAGE_ROOT / "opd" / "fixture" / "model"


def model_label(cfg: Config) -> str:
    """The model in a run's name: the preset's name for its own checkpoint (`fixture`, `qwen3`),
    else the checkpoint's last path part (`Qwen3-4B`)."""
    model = cfg.server.model.rstrip("/")
    if model in (cfg.model.path, "fixture") or Path(model).resolve() == _FIXTURE_DIR.resolve():
        return cfg.model.name
    return model.rsplit("/", 1)[-1] or model


def run_title(env: str, model: str, overrides: list[str], limit: int = 200) -> str:
    """A run's name from what was asked: `opd_coding fixture distill_topk=20 total_steps=6`
    (the environment, the model, the overrides that change what the run does)."""
    shown = []
    for override in overrides:
        key = override.lstrip("+~").split("=", 1)[0]
        if key in _UNNAMED or key.startswith(_UNNAMED_PREFIXES) or secrets.secret_key(key):
            continue
        shown.append(override.lstrip("+"))
    name = " ".join([env, model, *secrets.mask_overrides(shown)])
    return name if len(name) <= limit else name[: limit - 3] + "..."


def source_tags(argv: list[str]) -> dict[str, str]:
    """MLflow's source tags for the launcher (not the tracking process that makes the calls): the
    script it ran and the command line, with values of secret-looking keys hidden."""
    shown = [secrets.mask_text(a) for a in secrets.mask_overrides(argv[1:])]
    script = str(Path(argv[0]).resolve()) if argv and argv[0] else "python"
    module = Path(script).relative_to(_PACKAGE_ROOT).with_suffix("").as_posix().replace("/", ".") if script.startswith(str(_PACKAGE_ROOT)) else None
    command = " ".join(["python", "-m", module] if module else ["python", script]) + (" " + " ".join(shown) if shown else "")
    return {"mlflow.source.name": script, "mlflow.source.type": "LOCAL", "opd.command": command[:5000]}


def previous_run_id(out: Path, wait_s: float = 120.0) -> str | None:
    """The MLflow run a killed run in `out` was logging to (for resume=true), if any. A killed
    run's tracking process still sends the calls it was given, then exits: wait for it first."""
    try:
        pid = int(read_text(out / PROCESS_FILE, limit=64) or 0)
    except (OSError, ValueError):  # none, or not a regular file (a link, a FIFO: not waited on)
        pid = 0
    deadline = time.monotonic() + wait_s
    while pid > 0 and _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    path = out / RUN_FILE
    if not os.path.lexists(path):
        return None
    try:
        return json.loads(read_text(path, limit=1 << 16)).get("run_id")
    except ValueError as err:
        raise ConfigError(f"resume: {path} is not the run file a run writes ({err})", "resume") from None


def _alive(pid: int) -> bool:
    """Whether `pid` is still a running tracking process: not exited, not a zombie, and not
    another program that got the pid since."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except (OSError, IndexError):
        return False
    return b"opd.tracking.session" in cmdline and state != "Z"


@dataclass(frozen=True)
class RunInfo:
    """What the MLflow run says about itself: names, tags, the dataset input."""

    name: str | None
    parent_run_id: str | None
    experiment_id: str | None
    tags: dict[str, str]
    swept: dict[str, str]
    dataset: tuple[str, DatasetRef, list[dict[str, Any]], str] | None  # (name, ref, rows, context)
    # When the run started (epoch seconds; None: when the MLflow run is opened) and MLflow's source tags.
    started: float | None = None
    source: dict[str, str] = dataclasses.field(default_factory=dict)


@contextlib.contextmanager
def open_run(tracking: Any, out: Path, resolved: dict[str, Any], info: RunInfo, resume_id: str | None = None,
             kept: int = 0, begin: bool = False) -> Iterator[Tracker]:
    """The run's MLflow run for the length of the block (see the module docstring). A store that
    cannot be used is a ConfigError naming `tracking.uri`, raised before anything starts. The run
    is opened once `tracker.begin()` is called (at once with `begin=True`); a failure of its
    tracking fails the block at its next call to the tracker, or at its end. A block that raises
    leaves its reason in the run's tag `opd.error`."""
    check_store(tracking.uri, tracking.artifact_root)
    tracker = Tracker(tracking.uri, tracking.experiment, tracking.artifact_root, info.name, tracking.max_param_chars,
                      parent_run_id=info.parent_run_id, experiment_id=info.experiment_id, run_id=resume_id, run_file=out / RUN_FILE,
                      started=info.started, source=info.source)
    status = "FAILED"
    try:
        if begin:
            tracker.begin()
        if resume_id is not None:
            tracker.set_tags({"opd.resumed_with_groups": str(kept)})
            tracker.log_config(resolved, "config_resumed.yaml", params=False)
        else:
            tracker.log_config(resolved)
            tracker.log_params(info.swept)
            directories = {key: str(Path(str(resolved[key])).resolve()) for key in DIRECTORY_KEYS if resolved.get(key)}
            tracker.set_tags({**info.tags, **directories, "output_dir": str(out.resolve()), "opd.pid": str(os.getpid())})
            if info.dataset is not None:
                tracker.log_dataset(*info.dataset)
        yield tracker
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    except Exception as err:
        # Why it failed, on the run itself (the UI shows its tags), not only in the run's log.
        with contextlib.suppress(Exception):
            tracker.set_tags({"opd.error": f"{type(err).__name__}: {err}"[:5000]})
        raise
    finally:
        error = tracker.end(status)
    if error is not None:  # the block itself succeeded; its tracking did not
        raise error
