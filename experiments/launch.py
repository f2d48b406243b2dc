"""Entry point: `python -m experiments.launch env=inline_math total_steps=3 ...` (Hydra).

Compose and validate the config (errors name the key, before any server starts), load the
dataset, start or reach the inference server, run the environment, write groups.jsonl and
record everything in one MLflow run (nested under the sweep's parent run in a sweep).
Returns the objective (sweep.objective; by default the mean reward).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import statistics
from pathlib import Path
from typing import Any

os.environ.setdefault("WANDB_MODE", "disabled")  # atroposlib imports wandb; never let it start
os.environ.setdefault("WANDB_SILENT", "true")

import hydra  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from opd import tracing  # noqa: E402
from opd.config import Config, ConfigError, register, validate  # noqa: E402
from opd.loop import run_loop  # noqa: E402

logger = logging.getLogger("experiments.launch")
register()


def _resolved(cfg: DictConfig) -> dict[str, Any]:
    container = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(container, dict)
    return container


async def _train(env: Any, typed: Config, groups_path: Path, tracker: Any, watch: Any, kept: list[dict[str, Any]], groups: int) -> tuple[dict[str, float], dict[str, list[float]]]:
    from collections import Counter

    from opd.records import GroupWriter
    from opd.runner import run_generation

    history: dict[str, list[float]] = {}
    for group in kept:  # a resumed run's earlier groups count in its summary (already in MLflow)
        for key, value in env.group_metrics(group).items():
            history.setdefault(key, []).append(float(value))

    def on_metrics(metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            history.setdefault(key, []).append(float(value))
        if tracker is not None:
            tracker.log_metrics(metrics, step)

    api = None
    try:
        await watch.check()  # a server that is down at the start: wait (bounded) or fail clearly
        await env.setup()
        async with contextlib.AsyncExitStack() as stack:
            on_group = None
            if typed.mode == "serve":
                from opd.serve import TrainerAPI

                api = await stack.enter_async_context(TrainerAPI(typed.serve, typed.group_size, typed.server.max_model_len))
                on_group = api.send
            writer = stack.enter_context(GroupWriter(groups_path, fsync=typed.runner.fsync))
            stats = await run_generation(
                env, writer, typed.total_steps,
                groups_in_flight=groups,
                max_attempts_per_item=typed.runner.max_attempts_per_item,
                max_failed_groups=typed.runner.max_failed_groups,
                on_metrics=on_metrics,
                on_group=on_group,
                on_failure=watch.check,
                progress=typed.runner.progress,
                already_written=len(kept),
                skip_items=Counter(str(g.get("group_overrides", {}).get("item_id")) for g in kept),
            )
    finally:
        await env.close()
    rewards = history.get("reward/mean", [])
    summary = {
        "summary/groups_written": float(stats.written),
        "summary/groups_failed": float(stats.failed),
        "summary/items_given_up": float(stats.items_given_up),
        "summary/wall_s": stats.elapsed,
        "summary/groups_per_s": (stats.written - len(kept)) / stats.elapsed,
        "summary/reward_mean": statistics.fmean(rewards) if rewards else math.nan,
        "summary/server_outages": float(watch.outages),
        "summary/server_request_errors": float(sum(getattr(s, "request_errors", 0) for s in env.server.servers)),
        "summary/server_restarts": float(watch.restarts),
    }
    if api is not None:
        summary.update({"summary/serve_groups_sent": float(api.sent), "summary/serve_wait_s": api.waited_s})
    logger.info("wrote %d groups to %s in %.1f s (%d failed)", stats.written, groups_path, stats.elapsed, stats.failed)
    return summary, history


async def _evaluate(env: Any, typed: Config, groups: int) -> dict[str, float]:
    try:
        await env.setup()
        return await env.evaluate(concurrency=groups * typed.group_size)
    finally:
        await env.close()


def objective_of(name: str | None, mode: str, summary: dict[str, float], history: dict[str, list[float]]) -> float:
    """The sweep objective: a summary metric, or the mean of a per-group metric's history."""
    name = name or ("eval/accuracy" if mode == "evaluate" else "summary/reward_mean")
    if name in summary:
        return float(summary[name])
    if history.get(name):
        return statistics.fmean(history[name])
    known = sorted(set(summary) | set(history))
    raise ConfigError(f"sweep.objective: no metric {name!r} in this run; known: {', '.join(known)}")


RUN_FILE = "mlflow_run.json"


def _resume_state(typed: Config, sweep: Any, out: Path, groups_path: Path) -> tuple[list[dict[str, Any]], str | None]:
    """(valid groups kept from a killed run, its MLflow run id) for resume=true; ([], None) otherwise."""
    from opd.records import recover

    if not typed.resume:
        if groups_path.exists() and groups_path.stat().st_size > 0:
            raise ConfigError(f"resume: {groups_path} already has groups; continue it with resume=true or use another directory")
        return [], None
    if sweep is not None:
        raise ConfigError("resume: resume=true continues one run (hydra.run.dir=<its directory>), not a sweep job")
    if typed.mode == "evaluate":
        raise ConfigError("resume: only train and serve runs write groups to resume")
    if not groups_path.exists():
        raise ConfigError(f"resume: no {groups_path} to continue; pass hydra.run.dir=<the killed run's directory>")
    kept = recover(groups_path)
    previous = None
    run_file = out / RUN_FILE
    if typed.tracking.enabled and run_file.exists():
        previous = json.loads(run_file.read_text()).get("run_id")
    logger.info("resuming %s: %d valid groups kept, %d to go; MLflow run %s", groups_path, len(kept), max(0, typed.total_steps - len(kept)), previous or "new")
    return kept, previous


def _sweep_job() -> tuple[Any, dict[str, str]]:
    """(the sweep's state, this job's swept values) inside a sweep; (None, {}) for a single run."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from opd.sweep import job_label, read_state

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None, {}
    hydra_cfg = HydraConfig.get()
    state = read_state(hydra_cfg.sweep.dir)
    if state is None:
        # Hydra only warns when a callback raises; a sweep job must not run on unlogged.
        raise RuntimeError(
            f"sweep job without sweep state in {hydra_cfg.sweep.dir}: the sweep callback "
            "(opd.sweep.SweepCallback, hydra.callbacks.sweep) did not run or failed; see its warning above"
        )
    return state, job_label(list(hydra_cfg.overrides.task), state.swept)


def launch(cfg: DictConfig) -> float:
    """Run one experiment from a composed config; return the objective (mean reward or eval accuracy)."""
    from opd.build import build_env, groups_in_flight, inference_servers, load_data, resolve_model
    from opd.sweep import run_name, shared_server_for
    from opd.tracking import Tracker, dataset_source

    typed = validate(cfg)
    sweep, swept = _sweep_job()
    out = Path(typed.output_dir)
    groups_path = out / "groups.jsonl"
    kept, previous_run = _resume_state(typed, sweep, out, groups_path)
    out.mkdir(parents=True, exist_ok=True)
    resolved = _resolved(cfg)
    yaml_text = OmegaConf.to_yaml(resolved)
    (out / "config.yaml").write_text(yaml_text)
    data = load_data(typed)
    model = resolve_model(typed.server.model)

    tracker = None
    if typed.tracking.enabled:
        if sweep is not None and sweep.parent_run_id is None:
            raise RuntimeError(f"tracking is on but the sweep in {sweep.sweep_dir} has no MLflow parent run (was tracking off for the sweep?)")
        try:
            tracker = Tracker(
                typed.tracking.uri, typed.tracking.experiment, typed.tracking.artifact_root,
                typed.tracking.run_name or (run_name(swept) if sweep is not None else None), typed.tracking.max_param_chars,
                parent_run_id=sweep.parent_run_id if sweep else None, experiment_id=sweep.experiment_id if sweep else None,
                run_id=previous_run,
            )
        except Exception as err:  # MLflow raises many types for a bad or unreachable store
            raise ConfigError(f"tracking.uri: cannot open the MLflow store {typed.tracking.uri!r}: {type(err).__name__}: {str(err)[:300]}") from err
        (out / RUN_FILE).write_text(json.dumps({"run_id": tracker.run_id, "tracking_uri": tracker.uri}))
    status = "FAILED"
    try:
        if tracker is not None and previous_run is not None:
            tracker.set_tags({"opd.resumed_with_groups": str(len(kept))})
            tracker.mlflow.log_text(yaml_text, "config_resumed.yaml")
        elif tracker is not None:
            tracker.log_config(resolved, yaml_text)
            tracker.log_params(swept)
            tracker.set_tags({
                "env": typed.env.name, "mode": typed.mode, "model": typed.server.model,
                "server": typed.server.kind, "dataset": typed.dataset.name, "output_dir": str(out.resolve()),
                "opd.pid": str(os.getpid()),
                **({"opd.sweep_dir": sweep.sweep_dir, "opd.swept": ",".join(swept)} if sweep else {}),
            })
            if typed.tracking.log_input and previous_run is None:
                d = typed.dataset
                rows = data.eval if typed.mode == "evaluate" else data.train
                tracker.log_dataset(d.name, dataset_source(d.source, d.path, d.subset, d.split, data.source), rows, "eval" if typed.mode == "evaluate" else "train")
        if tracker is not None and typed.tracking.traces:
            _enable_tracing(typed, tracker.experiment_id)
        history: dict[str, list[float]] = {}
        env = None
        shared = shared_server_for(sweep, typed.server) if typed.server.kind == "local" else None
        with inference_servers(typed, model, out / "vllm", shared=shared) as (urls, watch):
            env = build_env(typed, data, model, urls)
            groups = groups_in_flight(typed, len(urls))
            logger.info("%d groups (%d rollouts) in flight for %d request slots", groups, groups * typed.group_size, typed.server.max_requests_in_flight * len(urls))
            if tracker is not None:
                tracker.set_tags({"opd.groups_in_flight": str(groups)})
            if typed.mode == "evaluate":
                summary = run_loop(_evaluate(env, typed, groups), typed.runner.uvloop)
            else:
                summary, history = run_loop(_train(env, typed, groups_path, tracker, watch, kept, groups), typed.runner.uvloop)
        objective = objective_of(typed.sweep.objective, typed.mode, summary, history)
        if tracker is not None:
            tracker.log_metrics({**summary, "objective": objective}, step=typed.total_steps if typed.mode != "evaluate" else 0)
        logger.info("summary: %s", {k: round(v, 4) for k, v in summary.items()})
        status = "FINISHED"
        return float(objective)
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        tracing.flush()
        tracing.enable(False)
        if tracker is not None:
            # Also for failed and killed runs: the groups written so far are the run's data.
            if typed.mode != "evaluate" and typed.tracking.log_data_artifacts and groups_path.exists():
                _log_data(tracker, groups_path, getattr(env, "tokenizer", None) or model, out)
            tracker.end(status)


def _log_data(tracker: Any, groups_path: Path, tokenizer: Any, out: Path) -> None:
    """groups.jsonl and its HTML viewer as artifacts under data/ (best effort: never masks the run's
    own error). `tokenizer` is the env's, or the model's name when the run failed before it had one."""
    from transformers import AutoTokenizer

    from opd.viewer import write_viewer

    try:
        tracker.log_artifact(groups_path, "data")
        if isinstance(tokenizer, str):
            tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        tracker.log_artifact(write_viewer(groups_path, tokenizer, out / "groups.html"), "data")
    except Exception as err:  # noqa: BLE001 - logged; the data itself is safe on disk
        logger.warning("could not log the data artifacts: %s", err)


def _enable_tracing(typed: Config, experiment_id: str) -> None:
    """One MLflow trace per training rollout, unless the run makes more than traces_max_rollouts."""
    rollouts = typed.total_steps * typed.group_size
    if typed.mode == "evaluate":
        logger.warning("tracking.traces: evaluation rollouts are not traced (only train/serve)")
    elif rollouts > typed.tracking.traces_max_rollouts:
        logger.warning("tracking.traces: off, this run makes %d rollouts > tracking.traces_max_rollouts=%d", rollouts, typed.tracking.traces_max_rollouts)
    else:
        tracing.enable(True, experiment_id)


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    try:
        return launch(cfg)
    except ConfigError as err:
        # A bad value: one clear line naming the key, no traceback.
        logger.error("configuration error: %s", err)
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            raise  # in a sweep: this job fails, the others still run, the sweep reports it
        raise SystemExit(2) from None


def _terminated(signum: int, frame: Any) -> None:
    # SIGTERM (kill, SLURM preemption) unwinds like Ctrl-C: servers stopped, runs marked KILLED.
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _terminated)
    main()
