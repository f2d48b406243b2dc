"""One experiment, from a validated config to its objective.

`run_experiment` writes the resolved config next to the data, loads the dataset, opens the MLflow
run, starts or reaches the inference servers (the teacher's through its kind: opd.teachers), builds
the environment and its sinks, and then either generates `total_steps` groups (train, serve) or
evaluates the held-out split (evaluate).
The summary is built here, in one place, from the runner's statistics, the sinks and the servers;
the objective (`sweep.objective`) is read from it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import statistics
import sys
import time
from contextlib import AsyncExitStack, ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from opd import build
from opd.config import Config, ConfigError
from opd.data.sources import TaskSet
from opd.envs.base import RolloutEnv
from opd.event_loop import run_loop
from opd.run_files import replace_file
from opd.runner import Progress, Runner, RunnerLimits, RunStats
from opd.serving.lifecycle import inference_servers
from opd.serving.watch import ServerWatch, Watches
from opd.sinks.base import Sink
from opd.sweep.progress import SUMMARY_FILE, job_line
from opd.sweep.state import SweepJob, run_name, shared_server_for
from opd.teachers import TeacherRun, teacher_of, workers_teacher
from opd.tracking.store import absolute_tracking_uri
from opd.tracking.mlflow_run import DatasetRef, RunInfo, Tracker, model_label, open_run, previous_run_id, run_title, source_tags
from opd.tracking.ui import run_link, ui_base, ui_command

logger = logging.getLogger(__name__)

GROUPS_FILE = "groups.jsonl"


@dataclass(frozen=True)
class Resumed:
    """What a resumed run continues: the valid groups kept, the duplicates dropped from the file
    and the MLflow run id."""

    groups: list[dict[str, Any]]
    run_id: str | None
    duplicates: int = 0


def resume_state(cfg: Config, job: SweepJob | None, out: Path) -> Resumed:
    """resume=true: the valid head of the killed run's groups.jsonl, each group once (the file is
    cut after it, duplicates taken out) and its MLflow run; otherwise nothing, and a directory that
    already has groups is refused. A groups.jsonl that is not a regular file of its own (a link,
    a FIFO, a file with other names: a crafted directory) is refused at once, nothing changed."""
    from opd.records import recover
    from opd.run_files import RunFileError, lstat_kind

    groups_path = out / GROUPS_FILE
    key = "resume" if cfg.resume else "hydra.run.dir"
    if (what := lstat_kind(groups_path)) is not None:
        raise ConfigError(f"{key}: {RunFileError(groups_path, what)}", key)
    if not cfg.resume:
        if groups_path.exists() and groups_path.stat().st_size > 0:
            raise ConfigError(f"resume: {groups_path} already has groups; continue it with resume=true or use another directory", "resume")
        return Resumed([], None)
    if job is not None:
        raise ConfigError("resume: resume=true continues one run (hydra.run.dir=<its directory>), not a sweep job", "resume")
    if cfg.mode == "evaluate":
        raise ConfigError("resume: only train and serve runs write groups to resume", "resume")
    if cfg.trainer.kind == "local":
        # The trainer's weights and step count are not restored, so the kept groups would never
        # be trained on and the run would quietly restart from the base checkpoint.
        raise ConfigError("resume: a run with trainer=local cannot be resumed (its trained weights are not restored); start it again", "resume")
    if not groups_path.exists():
        raise ConfigError(f"resume: no {groups_path} to continue; pass hydra.run.dir=<the killed run's directory>", "resume")
    try:
        recovered = recover(groups_path)
        run_id = previous_run_id(out) if cfg.tracking.enabled else None
    except RunFileError as err:  # groups.jsonl made a link since the check above; the MLflow run file one
        raise ConfigError(f"resume: {err}", "resume") from None
    kept = recovered.groups
    logger.info("resuming %s: %d valid groups kept%s, %d to go; MLflow run %s", groups_path, len(kept),
                f" ({recovered.duplicates} duplicates dropped)" if recovered.duplicates else "", max(0, cfg.total_steps - len(kept)), run_id or "new")
    return Resumed(kept, run_id, recovered.duplicates)


def run_info(cfg: Config, job: SweepJob | None, data: TaskSet, asked: list[str] | None = None, started: float | None = None) -> RunInfo:
    """The MLflow run's name (tracking.run_name, a sweep job's swept values, else what was
    `asked`: the env, the model and the overrides that change the run), parent, tags, start,
    source (the launcher's command line) and dataset input for this config."""
    if job is not None and job.state.parent_run_id is None:
        raise RuntimeError(f"tracking is on but the sweep in {job.state.sweep_dir} has no MLflow parent run (was tracking off for the sweep?)")
    tags = {"env": cfg.env.name, "mode": cfg.mode, "model": cfg.server.model, "server": cfg.server.kind, "dataset": cfg.dataset.name}
    if job is not None:
        tags.update(job.tags())
    dataset = None
    if cfg.tracking.log_input:
        d, evaluating = cfg.dataset, cfg.mode == "evaluate"
        dataset = (d.name, DatasetRef(d.source, d.path, d.subset, d.split, data.source), data.eval if evaluating else data.train, "eval" if evaluating else "train")
    return RunInfo(
        name=cfg.tracking.run_name or (run_name(job.swept) if job else run_title(cfg.env.name, model_label(cfg), asked or [])),
        parent_run_id=job.state.parent_run_id if job else None,
        experiment_id=job.state.experiment_id if job else None,
        tags=tags, swept=job.swept if job else {}, dataset=dataset, started=started, source=source_tags(sys.argv),
    )


def run_experiment(cfg: Config, job: SweepJob | None = None, asked: list[str] | None = None) -> float:
    """Run the experiment `cfg` describes (a sweep job when `job` is given; `asked`: the command
    line's overrides, which name the MLflow run); return its objective."""
    started, out = time.time(), Path(cfg.output_dir)
    teacher = teacher_of(cfg)
    resumed = resume_state(cfg, job, out)
    resolved = write_config(cfg, out)
    data = build.load_data(cfg)
    model = build.resolve_model(cfg.server.model)
    build.preflight(cfg, model)
    teacher.preflight(model)
    if job is not None:
        logger.info("%s: %s", job_line(job.state, job.num), run_name(job.swept))
    sweep = job.state if job else None
    ids: tuple[str | None, str | None] = (None, None)
    with ExitStack() as stack:
        shared = shared_server_for(sweep, cfg.server) if cfg.server.kind == "local" else None
        tracker = None
        if cfg.tracking.enabled:
            # MLflow works in a thread of its own: at once while a server starts here, else once
            # the first requests are sent (begin() below), so that it never delays them.
            tracker = stack.enter_context(open_run(cfg.tracking, out, resolved, run_info(cfg, job, data, asked, started), resumed.run_id,
                                                   len(resumed.groups), begin=cfg.server.kind == "local" and not shared))
        tracer = build.tracer(cfg, tracker)
        stack.callback(tracer.flush)
        # The teacher's own server (if it needs one) starts beside the policy's.
        taught = stack.enter_context(teacher.serve(model, out / "vllm_teacher", sweep))
        urls, watch = stack.enter_context(inference_servers(cfg, model, out / "vllm", shared=shared))
        env = build.environment(cfg, data, model, build.server_pool(cfg, model, urls), tracer, build.judge_pool(cfg), teacher.scorer(taught, urls, tracer))
        groups = groups_started(cfg, len(urls), tracker, resumed)
        if cfg.mode == "evaluate":
            summary, history = run_loop(_evaluate(env, watch, build.evaluator(cfg, env, groups * cfg.group_size, tracker)), cfg.runner.uvloop), {}
        else:
            summary, history = generate_groups(cfg, job, stack, data, model, urls, env, watch, taught, tracker, groups, resumed)
        objective_name, objective = objective_for(cfg, summary, history)
        if tracker is not None:
            log_objective(cfg, job, tracker, objective_name, objective, summary)
            ids = (tracker.run_id, tracker.experiment_id)
    write_report(cfg, job, out, started, summary, history, objective_name, objective, ids)
    return objective


def write_config(cfg: Config, out: Path) -> Any:
    """The resolved config, written to `out`/config.yaml next to the data (`out` made here)."""
    out.mkdir(parents=True, exist_ok=True)
    resolved = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
    replace_file(out / "config.yaml", OmegaConf.to_yaml(resolved))
    return resolved


def groups_started(cfg: Config, servers: int, tracker: Tracker | None, resumed: Resumed) -> int:
    """How many groups run at once over `servers` (said in the log and the MLflow run, whose
    thread then begins)."""
    groups = build.groups_in_flight(cfg, servers)
    logger.info("%d groups (%d rollouts) in flight for %d request slots", groups, groups * cfg.group_size, cfg.server.max_requests_in_flight * servers)
    if tracker is not None:
        tracker.set_tags({"opd.groups_in_flight": str(groups)})
        if resumed.duplicates:
            tracker.set_tags({"opd.resume_duplicates_dropped": str(resumed.duplicates)})
        tracker.begin()
    return groups


def generate_groups(cfg: Config, job: SweepJob | None, stack: ExitStack, data: TaskSet, model: str, urls: list[str], env: RolloutEnv,
                    watch: ServerWatch, taught: TeacherRun, tracker: Tracker | None, groups: int, resumed: Resumed) -> tuple[dict[str, float], dict[str, list[float]]]:
    """mode=train or serve: the sinks, the environment workers (runner.workers > 1, stopped with
    `stack`) and the generation loop; the run's summary and its per-group history."""
    sinks = build.sinks(cfg, env, model, urls, tracker, groups * cfg.group_size, taught.ceiling(data, Path(job.state.sweep_dir) if job else None))
    workers = None
    if cfg.runner.workers > 1:  # environment workers on Ray; the sinks stay here
        from opd.distributed.source import environment_workers

        workers = stack.enter_context(environment_workers(cfg, data, model, urls, workers_teacher(cfg, taught)))
    # Jobs at once in this machine's processes: the launcher shows one bar for all of them.
    progress = cfg.runner.progress and not (job is not None and job.state.parallel)
    report = progress_report(cfg, env if workers is None else None, tracker)
    stats, extra = run_loop(_generate(cfg, env, sinks, watch, groups, resumed.groups, workers, progress, taught.watch, report), cfg.runner.uvloop)
    logger.info("wrote %d groups to %s in %.1f s (%d failed)", stats.written, Path(cfg.output_dir) / GROUPS_FILE, stats.elapsed, stats.failed)
    return {**summarize(stats, sinks, env, watch, taught.watch), **extra}, stats.history


def objective_for(cfg: Config, summary: dict[str, float], history: dict[str, list[float]]) -> tuple[str, float]:
    """The objective's name (sweep.objective, else `default_objective`) and value."""
    name = cfg.sweep.objective or default_objective(cfg)
    return name, objective_of(name, summary, history)


def log_objective(cfg: Config, job: SweepJob | None, tracker: Tracker, name: str, objective: float, summary: dict[str, float]) -> None:
    """The summary and the objective in the MLflow run (a sweep job's objective in its parent's too)."""
    tracker.set_tags({"opd.objective": name})
    tracker.log_metrics({**summary, "objective": objective}, step=cfg.total_steps if cfg.mode != "evaluate" else 0)
    if job is not None:
        tracker.log_to_parent({"objective": objective}, step=job.num)


def write_report(cfg: Config, job: SweepJob | None, out: Path, started: float, summary: dict[str, float], history: dict[str, list[float]],
                 objective_name: str, objective: float, ids: tuple[str | None, str | None]) -> None:
    """summary.json in `out` (`ids`: the MLflow run's and experiment's), and the run's end in the
    log: the summary table, or for a sweep job one line on the console and the table in its log."""
    run_id, experiment_id = ids
    report = {**summary, "objective": objective, "objective_name": objective_name, "accuracy": _accuracy(summary, history),
              "run_s": time.time() - started, "output_dir": str(out.resolve()), "mlflow_run_id": run_id,
              "mlflow_experiment_id": experiment_id,
              "tracking_uri": absolute_tracking_uri(cfg.tracking.uri) if cfg.tracking.enabled else None}
    replace_file(out / SUMMARY_FILE, json.dumps(report, indent=2, default=str))
    if job is None:
        logger.info("%s", summary_table(cfg, report))
    else:  # jobs may run at once: one line each on the console, the table in the job's log
        logger.info("%s", summary_table(cfg, report), extra={"file_only": True})
        logger.info("sweep job %d (%s) finished in %.0f s: objective %s = %.4g, accuracy %.4g; %s", job.num + 1, run_name(job.swept),
                    report["run_s"], objective_name, objective, report["accuracy"], out)


def _accuracy(summary: dict[str, float], history: dict[str, list[float]]) -> float:
    """The run's accuracy: the written groups' mean `accuracy`, or the evaluation's."""
    if history.get("accuracy"):
        return statistics.fmean(history["accuracy"])
    return float(summary.get("eval/accuracy", math.nan))


def summary_table(cfg: Config, report: dict[str, Any]) -> str:
    """The end of a run as its user reads it: groups, failures, reward, the inference requests,
    accuracy, time, where the data, the log and the MLflow run are (every number is also in
    summary.json and MLflow)."""
    def number(value: Any) -> str:
        return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.4g}"

    out = Path(report["output_dir"])
    rows = [("run", f"{cfg.mode} {cfg.env.name} on {model_label(cfg)} in {report['run_s']:.0f} s")]
    if "summary/groups_written" in report:
        rows += [("groups", f"{report['summary/groups_written']:.0f} written, {report['summary/groups_failed']:.0f} failed, "
                            f"{report['summary/groups_dropped']:.0f} dropped ({number(report.get('summary/groups_per_s'))} groups/s)"),
                 ("reward", f"{number(report.get('summary/reward_mean'))} (mean)")]
    if "summary/server_request_errors" in report:
        rows.append(("requests", f"{report['summary/server_request_errors']:.0f} failed for good, {report.get('summary/server_request_retries', 0):.0f} "
                                 f"retried, {report.get('summary/server_requests_cancelled', 0):.0f} cut off by the run's end, "
                                 f"{report.get('summary/server_reconnects', 0):.0f} sent again on a new connection"))
    rows += [("accuracy", number(report["accuracy"])),
             ("objective", f"{number(report['objective'])} ({report['objective_name']})")]
    if (out / GROUPS_FILE).exists():
        rows.append(("data", f"{out / GROUPS_FILE} (browse: {out / 'groups.html'})"))
    rows.append(("log", str(out / "launch.log") if (out / "launch.log").exists() else str(out)))
    if report["mlflow_run_id"]:
        base = ui_base(report["tracking_uri"])
        serve = ui_command(report["tracking_uri"], base)
        rows.append(("MLflow", f"run {report['mlflow_run_id']} in experiment {cfg.tracking.experiment}: "
                               f"{run_link(base, str(report.get('mlflow_experiment_id')), report['mlflow_run_id'])}" + (f" ({serve})" if serve else "")))
    width = max(len(name) for name, _ in rows)
    return "\n".join(["finished:"] + [f"  {name.ljust(width)}  {value}" for name, value in rows])


def progress_report(cfg: Config, env: RolloutEnv | None, tracker: Tracker | None) -> Progress:
    """Where the run says how far it is besides the bar: its log every `runner.progress_every`
    groups and while none is written (`runner.quiet_after_s`), with what `env`'s requests are doing
    (None: they are the workers'), the MLflow run's tag `opd.progress`, and the console when the bar
    is off."""
    def requests() -> str:
        assert env is not None
        pools = env.request_pools()
        counts = env.request_counts()
        return (f"{sum(p.in_use for p in pools)} in flight, {sum(p.waiting for p in pools)} waiting for a slot, {counts.retries} retried, "
                f"{counts.failed} failed for good")

    publish = (lambda line: tracker.set_tags({"opd.progress": line})) if tracker is not None else None
    return Progress(cfg.runner.progress_every, cfg.runner.quiet_after_s, publish, requests if env is not None else None, console=not cfg.runner.progress)


async def _generate(cfg: Config, env: RolloutEnv, sinks: list[Sink], watch: ServerWatch, groups: int, kept: list[dict[str, Any]],
                    workers: list[Any] | None = None, progress: bool = True, teacher_watch: ServerWatch | None = None,
                    report: Progress | None = None) -> tuple[RunStats, dict[str, float]]:
    """Open the sinks, run the generation loop (on `workers` when given), close everything (sinks
    learn the final status); the runner's statistics and the workers' `summary/*`. After a failed
    group the policy's servers are checked, then teacher=model's (`teacher_watch`)."""
    status = "FAILED"
    source: Any = env
    if workers is not None:
        from opd.distributed.source import WorkerSource

        source = WorkerSource(env, workers, cfg.runner.ray.startup_timeout_s)
    async with AsyncExitStack() as stack:
        stack.push_async_callback(env.close)
        checks = Watches(watch, teacher_watch)
        await checks.check()  # a server that is down at the start: wait (bounded) or fail clearly
        await env.setup()
        for sink in sinks:
            await sink.open()
            stack.push_async_callback(lambda s=sink: s.close(status))
            watch.after_restart.append(sink.server_restarted)
        try:
            max_dropped = cfg.runner.max_dropped_groups if cfg.runner.max_dropped_groups is not None else 10 * cfg.total_steps
            limits = RunnerLimits(groups, cfg.runner.max_attempts_per_item, cfg.runner.max_failed_groups, max_dropped)
            runner = Runner(source, sinks, cfg.total_steps, limits, on_failure=checks.check, progress=progress, kept=kept,
                            drop=env.drop_reason, report=report)
            stats = await runner.run()
            status = "FINISHED"
            return stats, (await source.summary() if workers is not None else {})
        except (KeyboardInterrupt, asyncio.CancelledError):
            status = "KILLED"
            raise


async def _evaluate(env: RolloutEnv, watch: ServerWatch, evaluator: Any) -> dict[str, float]:
    """mode=evaluate: one evaluation, recorded at step 0; its metrics are the summary."""
    try:
        await watch.check()
        await env.setup()
        return (await evaluator.run(0)).metrics
    finally:
        await env.close()


def summarize(stats: RunStats, sinks: list[Sink], env: RolloutEnv, watch: ServerWatch, teacher_watch: ServerWatch | None = None) -> dict[str, float]:
    """The run's `summary/*` metrics: the runner's counts, each sink's, the servers' (the
    teacher's own, when it has a watch)."""
    rewards = stats.history.get("reward/mean", [])
    requests = env.request_counts()
    summary = {
        "summary/groups_written": float(stats.written),
        "summary/groups_failed": float(stats.failed),
        "summary/groups_dropped": float(stats.dropped),
        "summary/items_given_up": float(stats.items_given_up),
        "summary/wall_s": stats.elapsed,
        "summary/groups_per_s": stats.groups_per_s,
        "summary/reward_mean": statistics.fmean(rewards) if rewards else math.nan,
        "summary/server_outages": float(watch.outages),
        # Requests that failed for good (after their retries); the other three say what else happened.
        "summary/server_request_errors": float(requests.failed),
        "summary/server_request_retries": float(requests.retries),
        "summary/server_requests_cancelled": float(requests.cancelled),
        "summary/server_reconnects": float(requests.reconnects),
        "summary/server_restarts": float(watch.restarts),
    }
    if teacher_watch is not None:
        summary.update({"summary/teacher_server_outages": float(teacher_watch.outages), "summary/teacher_server_restarts": float(teacher_watch.restarts)})
    for sink in sinks:
        summary.update(sink.summary())
    return summary


def default_objective(cfg: Config) -> str:
    """What a job returns to the sweeper unless sweep.objective says otherwise; never a metric that
    grows with the reward weights being swept: held-out accuracy where there is an evaluation
    (sampled when it samples), else the written groups' accuracy."""
    sampled = cfg.eval.samples_per_item > 0
    if cfg.mode == "evaluate":
        return "eval/sampled_accuracy" if sampled else "eval/accuracy"
    if cfg.eval.every is not None:
        return "summary/final_sampled_accuracy" if sampled else "summary/final_accuracy"
    return "accuracy"


def objective_of(name: str, summary: dict[str, float], history: dict[str, list[float]]) -> float:
    """The sweep objective: a summary metric, or the mean of a per-group metric's history."""
    if name in summary:
        return float(summary[name])
    if history.get(name):
        return statistics.fmean(history[name])
    known = sorted(set(summary) | set(history))
    raise ConfigError(f"sweep.objective: no metric {name!r} in this run; known: {', '.join(known)}", "sweep.objective")
