"""The teacher, a component: one class per kind (`none`, `self_hint`, `model`), registered in
`TEACHERS` under the name `teacher.kind` selects it by (conf/teacher/<kind>.yaml).

A kind says
- `needs_scorer`: whether it scores every sampled token of every rollout with a scorer its run
  gives (teacher=model): the base environment then writes its rows on every trained token and
  labels the group with the kind's registered name (`group_overrides.teacher`), which the record
  rules hold to a row on every trained token. Such a kind whose run gives no scorer is refused,
  naming `teacher.kind` (before any server starts where it keeps the base `serve`, else as the
  environment is built), never run without rows;
- `rows()`: what writes teacher rows into this run's records, in the config's words (None: nothing
  does); the loss terms that need them are checked against it before any server starts;
- `preflight(model)`: what it checks before any server starts (every kind: that the weighted loss
  terms have rows to read; teacher=model: its model, tokenizer, top-K and running server);
- `serve(model, workdir, sweep)`: a context manager, entered before the policy's servers start:
  its own server (teacher=model: started beside the policy's, always stopped), yielding the
  `TeacherRun` the experiment reads: the scorer the environment gets, the watch of its server, the
  evaluation's ceiling and what environment workers need (`for_workers`), from which each worker
  rebuilds the run through the kind (`worker_run`) and gets its scorer by the same call;
- `shared_server(workdir)`: the server of its own that the jobs of a sweep may share (a
  `SharedServer`, not started; None: none), which the sweep's callback (opd.sweep.callback) starts
  before the jobs and stops after them, its URLs and settings in the sweep's state, where the
  kind's own `serve` finds them (teacher=model: a local server, whose weights never change).
A kind of yours is a `Teacher` subclass registered with `@TEACHERS.register("name")`; run_experiment
reads only this interface (the scorer through `Teacher.scorer`, which checks it). A name
`teacher.kind` gives that is not registered is a ConfigError naming `teacher`, with the nearest name.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any, Iterator

from opd import build
from opd.config import Config, ConfigError
from opd.data.sources import TaskSet
from opd.registry import Registry
from opd.serving.lifecycle import TeacherServer, local_teacher_server, teacher_evaluated
from opd.serving.watch import ServerWatch
from opd.sweep.state import SweepState, shared_teacher_for, teacher_server_settings
from opd.tracking.traces import Tracer
from opd.train.teacher_terms import check_loss_weights

logger = logging.getLogger(__name__)


class TeacherRun:
    """A teacher's side of one run, once its server (if any) is starting: no teacher here."""

    # The watch of the teacher's own server (None: it has none, or the policy's watch covers it).
    watch: ServerWatch | None = None

    def scorer(self, policy_urls: list[str], tracer: Tracer) -> Any:
        """What scores the environment's rollouts (given to it as `teacher`); None: the env's own
        stage writes whatever rows there are (self_hint), or none."""
        return None

    def ceiling(self, data: TaskSet, cache_dir: Path | None) -> Any:
        """The evaluation's ceiling (opd.sinks.evaluation.Ceiling), None where it evaluates none."""
        return None

    def for_workers(self) -> Any:
        """What each environment worker (runner.workers > 1, opd.distributed.worker) rebuilds this
        run from, through its kind (`Teacher.worker_run`): picklable, no live server (the driver
        keeps and watches that); a run that is picklable itself may return itself. None: nothing."""
        return None


class SharedServer:
    """A teacher's server for every job of a sweep (`Teacher.shared_server`): the sweep's callback
    starts it once, before the jobs, and always stops it after them."""

    def start(self) -> tuple[list[str], dict[str, Any]]:
        """Start it; its /v1 base URLs and the settings a job's own would be started with (the
        sweep's state keeps both: `SweepState.teacher_urls`, `teacher_settings`)."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop it (also after a failed or partial start)."""


class Teacher:
    """One kind of teacher over a run's config; this base is teacher=none's."""

    # Whether its run gives a scorer of every sampled token of every rollout (see the module docstring).
    needs_scorer: bool = False

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg

    @property
    def name(self) -> str:
        """The name it is registered and selected under (`teacher.kind`): the label of its groups."""
        return self.cfg.teacher.kind

    def rows(self) -> str | None:
        """What writes teacher rows into this run's records (None: nothing): a kind that
        `needs_scorer`, its scorer."""
        return f"teacher={self.name}" if self.needs_scorer else None

    def preflight(self, model: str) -> None:
        """Checks before any server starts (`model`: the student's): a kind that `needs_scorer`
        serves one (its own `serve`), then this base's `check_loss`."""
        if self.needs_scorer and type(self).serve is Teacher.serve:
            raise ConfigError(f"teacher.kind: teacher={self.name} needs a scorer (it writes a teacher row on every trained token) but its serve() "
                              f"gives none: {type(self).__qualname__} keeps the base Teacher.serve, whose run scores nothing", "teacher.kind")
        self.check_loss()

    def check_loss(self) -> None:
        """trainer=local's weighted loss terms against the rows this teacher writes (a ConfigError
        naming `trainer.loss` where they would train nothing)."""
        if self.cfg.trainer.kind == "local":
            check_loss_weights(self.cfg, self.rows())

    @contextlib.contextmanager
    def serve(self, model: str, workdir: Path, sweep: SweepState | None = None) -> Iterator[TeacherRun]:
        """Its server for the run's length (`workdir`: a local server's log and caches; `sweep`:
        the running sweep, whose shared teacher server is used when it matches)."""
        yield TeacherRun()

    def shared_server(self, workdir: Path) -> SharedServer | None:
        """The server of its own that every job of a sweep may use (`workdir`: its log and caches),
        not started; None where it has none to share."""
        return None

    def worker_run(self, shipped: Any) -> TeacherRun:
        """In an environment worker, over its config (its share of the teacher's slots): the run
        that `shipped` (what the driver's run gave, `TeacherRun.for_workers`) describes, whose
        scorer the worker gets through `scorer`, as the driver's does. This base: `shipped` itself
        when it is a TeacherRun, else a run with no scorer (refused for a kind that needs one)."""
        return shipped if isinstance(shipped, TeacherRun) else TeacherRun()

    def scorer(self, run: TeacherRun, policy_urls: list[str], tracer: Tracer) -> Any:
        """`run`'s scorer, for the environment (`run.scorer`). A kind that `needs_scorer` gives
        one wherever groups are written (mode=evaluate measures the policy alone), and, with
        environment workers (runner.workers > 1), theirs (`run.for_workers`): a ConfigError naming
        `teacher.kind` otherwise, so that no group is written without its rows."""
        scorer = run.scorer(policy_urls, tracer)
        if not self.needs_scorer or self.cfg.mode == "evaluate":
            return scorer
        if scorer is None:
            raise ConfigError(f"teacher.kind: teacher={self.name} needs a scorer (it writes a teacher row on every trained token) but its run "
                              f"gives none (TeacherRun.scorer of {type(run).__qualname__} returned None)", "teacher.kind")
        if self.cfg.runner.workers > 1 and run.for_workers() is None:
            raise ConfigError(f"teacher.kind: teacher={self.name} gives environment workers (runner.workers={self.cfg.runner.workers}) no scorer "
                              f"(TeacherRun.for_workers of {type(run).__qualname__} returned None): they would write groups without its rows; "
                              f"use runner.workers=1", "teacher.kind")
        return scorer


TEACHERS: Registry[type[Teacher]] = Registry("teacher", "teacher")


@TEACHERS.register("none")
class NoTeacher(Teacher):
    """teacher=none: plain RL data, no teacher rows."""


@TEACHERS.register("self_hint")
class SelfHintTeacher(Teacher):
    """teacher=self_hint: the policy's own server, given the judge's hindsight hint, scores the
    hinted turns; the env's own stage (opd_coding) writes those rows, only while its judge runs."""

    def rows(self) -> str | None:
        # The self-hint teacher scores only turns the judge hinted, and the judge runs only when enabled.
        return "teacher=self_hint (env.opd.enabled)" if getattr(getattr(self.cfg.env, "opd", None), "enabled", False) else None


@TEACHERS.register("model")
class ModelTeacher(Teacher):
    """teacher=model: a model of the student's tokenizer scores every sampled token of every
    rollout, on its own server (or the policy's, when it is the same model and not refreshed)."""

    needs_scorer = True

    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg)
        # The teacher's model directory (or running server's model name), once checked.
        self.model: str | None = None

    def preflight(self, model: str) -> None:
        """mode=evaluate measures the policy alone (no teacher checked or served); otherwise
        `check(model)`."""
        super().preflight(model)
        if self.cfg.mode == "evaluate":
            logger.info("mode=evaluate measures the policy alone: teacher=model's server is not started")
            return
        self.model = self.check(model)

    def check(self, model: str) -> str:
        """The teacher's model found (the returned directory or name), its running server answering
        and serving it, top-K within its vocabulary, and its tokenizer the student's (`model`:
        vocabulary, special tokens; the chat template when it renders a hinted context): a
        mismatch fails with one line naming both models."""
        from opd.distill.teacher_model import check_tokenizers
        from opd.serving.watch import check_servers

        cfg = self.cfg
        name = cfg.teacher.server.model
        teacher = build.resolve_model(name, "teacher.server.model")
        vocab = build.vocabulary_size(teacher)
        if vocab is not None and cfg.teacher.topk > vocab:
            raise ConfigError(f"teacher.topk must be <= the teacher's vocabulary ({vocab} tokens, {teacher}), got {cfg.teacher.topk}", "teacher.topk")
        check_tokenizers(model, teacher, cfg.server.model, name, compare_template=cfg.teacher.hint)
        if cfg.teacher.server.base_url is not None:
            check_servers([cfg.teacher.server.base_url], teacher if name in build.PROJECT_MODELS else name, "teacher.server.base_url", "teacher.server.model")
        return teacher

    @contextlib.contextmanager
    def serve(self, model: str, workdir: Path, sweep: SweepState | None = None) -> Iterator[TeacherRun]:
        if self.model is None:  # mode=evaluate (or never checked): no teacher in this run
            yield TeacherRun()
            return
        with TeacherServer(self.cfg, model, self.model, workdir, shared_teacher_for(sweep, self.cfg, self.model)) as server:
            yield ModelTeacherRun(self.cfg, self.model, server)

    def worker_run(self, shipped: Any) -> TeacherRun:
        """The teacher's model and URLs the driver's run shipped, scored over this worker's config."""
        model, urls = shipped
        return ModelWorkerRun(self.cfg, model, list(urls))

    def shared_server(self, workdir: Path) -> SharedServer | None:
        """A local teacher server for the sweep's jobs (the teacher's weights never change, so jobs
        that train the policy one after another share it as they share the policy's); None with a
        running one (teacher.server.base_url, which every job uses as it is) or mode=evaluate (no
        teacher served)."""
        if self.cfg.teacher.server.base_url is not None or self.cfg.mode == "evaluate":
            return None
        return SharedModelServer(self.cfg, workdir)


class SharedModelServer(SharedServer):
    """teacher=model's local server for a sweep: its model resolved when it starts."""

    def __init__(self, cfg: Config, workdir: Path) -> None:
        self.cfg, self.workdir = cfg, workdir
        self.local: Any = None

    def start(self) -> tuple[list[str], dict[str, Any]]:
        teacher = build.resolve_model(self.cfg.teacher.server.model, "teacher.server.model")
        self.local = local_teacher_server(self.cfg, teacher, self.workdir)
        return [self.local.start()], teacher_server_settings(self.cfg, teacher)

    def stop(self) -> None:
        if self.local is not None:
            self.local.stop()


class ModelTeacherRun(TeacherRun):
    """teacher=model's side of a run: its server's URLs (waited for when the scorer is built)."""

    def __init__(self, cfg: Config, model: str, server: TeacherServer) -> None:
        self.cfg, self.model, self.server = cfg, model, server
        self.urls: list[str] = []

    def scorer(self, policy_urls: list[str], tracer: Tracer) -> Any:
        self.urls = self.server.urls(policy_urls)
        self.watch = self.server.watch()
        return build.teacher_model(self.cfg, self.model, self.urls, tracer)

    def ceiling(self, data: TaskSet, cache_dir: Path | None) -> Any:
        """The evaluation's ceiling (`eval.teacher`): the configured environment generating with
        the teacher (over its own pool, no teacher of its own, no traces), its evaluation kept in
        `cache_dir` (a sweep's directory) for the other runs that evaluate the same teacher."""
        if not teacher_evaluated(self.cfg):
            return None
        from opd.sinks.evaluation import Ceiling

        pool = build.teacher_pool(self.cfg, self.model, self.urls)
        return Ceiling(build.environment(self.cfg, data, self.model, pool, Tracer.off(), untaught=True), self.model, cache_dir)

    def for_workers(self) -> tuple[str, list[str]] | None:
        return (self.model, self.urls) if self.urls else None


class ModelWorkerRun(TeacherRun):
    """teacher=model's side of a run in an environment worker: the driver's server URLs, scored
    within the worker's share of teacher.max_concurrent (its config's)."""

    def __init__(self, cfg: Config, model: str, urls: list[str]) -> None:
        self.cfg, self.model, self.urls = cfg, model, urls

    def scorer(self, policy_urls: list[str], tracer: Tracer) -> Any:
        return build.teacher_model(self.cfg, self.model, self.urls, tracer)

    def for_workers(self) -> tuple[str, list[str]]:
        return self.model, self.urls


def workers_teacher(cfg: Any, run: TeacherRun) -> tuple[type[Teacher], Any] | None:
    """What environment workers build their scorer from (opd.distributed.worker.teacher_scorer):
    the configured kind (its registry entry, a class) and what `run` ships to them; None: nothing."""
    shipped = run.for_workers()
    return None if shipped is None else (TEACHERS.get(cfg.teacher.kind), shipped)


def teacher_of(cfg: Any) -> Teacher:
    """The configured kind of teacher over `cfg` (a ConfigError naming `teacher` when no kind of
    that name is registered)."""
    return TEACHERS.get(cfg.teacher.kind)(cfg)
