"""Entry point: `python -m experiments.launch env=inline_math total_steps=3 ...` (Hydra).

Compose and validate the config (errors name the key, before any server starts), load the
dataset, start or reach the inference server, run the environment, write groups.jsonl and
record everything in one MLflow run. Returns the mean reward (a sweep's objective).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import statistics
from pathlib import Path
from typing import Any

os.environ.setdefault("WANDB_MODE", "disabled")  # atroposlib imports wandb; never let it start
os.environ.setdefault("WANDB_SILENT", "true")

import hydra  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from opd.config import Config, ConfigError, register, validate  # noqa: E402

logger = logging.getLogger("experiments.launch")
register()
PROJECT_ROOT = Path(__file__).resolve().parent.parent


def _resolved(cfg: DictConfig) -> dict[str, Any]:
    container = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(container, dict)
    return container


async def _train(env: Any, typed: Config, groups_path: Path, tracker: Any) -> dict[str, float]:
    from opd.records import GroupWriter
    from opd.runner import run_generation

    rewards: list[float] = []

    def on_metrics(metrics: dict[str, float], step: int) -> None:
        rewards.append(metrics["reward/mean"])
        if tracker is not None:
            tracker.log_metrics(metrics, step)

    try:
        await env.setup()
        with GroupWriter(groups_path, fsync=typed.runner.fsync) as writer:
            stats = await run_generation(
                env, writer, typed.total_steps,
                groups_in_flight=typed.runner.groups_in_flight,
                max_attempts_per_item=typed.runner.max_attempts_per_item,
                max_failed_groups=typed.runner.max_failed_groups,
                on_metrics=on_metrics,
                progress=typed.runner.progress,
            )
    finally:
        await env.close()
    summary = {
        "summary/groups_written": float(stats.written),
        "summary/groups_failed": float(stats.failed),
        "summary/items_given_up": float(stats.items_given_up),
        "summary/wall_s": stats.elapsed,
        "summary/groups_per_s": stats.written / stats.elapsed,
        "summary/reward_mean": statistics.fmean(rewards) if rewards else math.nan,
    }
    logger.info("wrote %d groups to %s in %.1f s (%d failed)", stats.written, groups_path, stats.elapsed, stats.failed)
    return summary


async def _evaluate(env: Any, typed: Config) -> dict[str, float]:
    try:
        await env.setup()
        return await env.evaluate(concurrency=typed.runner.groups_in_flight * typed.group_size)
    finally:
        await env.close()


def launch(cfg: DictConfig) -> float:
    """Run one experiment from a composed config; return the objective (mean reward or eval accuracy)."""
    from opd.build import build_env, inference_servers, load_data, resolve_model
    from opd.tracking import Tracker, git_commit

    typed = validate(cfg)
    out = Path(typed.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    resolved = _resolved(cfg)
    yaml_text = OmegaConf.to_yaml(resolved)
    (out / "config.yaml").write_text(yaml_text)
    data = load_data(typed)
    model = resolve_model(typed.server.model)

    tracker = None
    if typed.tracking.enabled:
        tracker = Tracker(typed.tracking.uri, typed.tracking.experiment, typed.tracking.artifact_root, typed.tracking.run_name, typed.tracking.max_param_chars)
    status = "FAILED"
    try:
        if tracker is not None:
            tracker.log_config(resolved, yaml_text)
            tracker.set_tags({
                "env": typed.env.name, "mode": typed.mode, "model": typed.server.model,
                "server": typed.server.kind, "dataset": typed.dataset.name,
                "git_commit": git_commit(PROJECT_ROOT), "output_dir": str(out.resolve()),
            })
        groups_path = out / "groups.jsonl"
        with inference_servers(typed, model, out / "vllm") as urls:
            env = build_env(typed, data, model, urls)
            if typed.mode == "evaluate":
                summary = asyncio.run(_evaluate(env, typed))
                objective = summary["eval/accuracy"]
            else:
                summary = asyncio.run(_train(env, typed, groups_path, tracker))
                objective = summary["summary/reward_mean"]
        if tracker is not None:
            tracker.log_metrics(summary, step=typed.total_steps if typed.mode == "train" else 0)
            if typed.mode == "train" and typed.tracking.log_data_artifacts and groups_path.exists():
                from opd.viewer import write_viewer

                tracker.log_artifact(groups_path, "data")
                try:
                    tracker.log_artifact(write_viewer(groups_path, env.tokenizer, out / "groups.html"), "data")
                except RuntimeError as err:
                    logger.warning("no HTML viewer: %s", err)
        logger.info("summary: %s", {k: round(v, 4) for k, v in summary.items()})
        status = "FINISHED"
        return float(objective)
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        if tracker is not None:
            tracker.end(status)


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float:
    try:
        return launch(cfg)
    except ConfigError as err:
        # A bad value: one clear line naming the key, no traceback.
        logger.error("configuration error: %s", err)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
