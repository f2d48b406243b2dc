"""Sinks by name: `sinks: [...]` in the config lists, in order, the sinks a run may hand its
groups to after the JSONL file (always first: a group is on disk before anything else sees it).

A name is a registered sink (`@sink_factory("name")`, below for the project's own) or
`package.module:factory` for one of yours, imported when the run starts. A factory takes the
run's `SinkContext` and returns the sink, or None where the run does not use it (`mlflow` without
tracking, `trainer` without trainer=local), so the default list serves every mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from opd.config import Config, ConfigError, load_object
from opd.registry import Registry
from opd.sinks.base import Sink

if TYPE_CHECKING:
    from opd.envs.base import RolloutEnv
    from opd.sinks.evaluation import Ceiling
    from opd.tracking.mlflow_run import Tracker


@dataclass(frozen=True)
class SinkContext:
    """What a sink may be built from: the run's config, environment, served model and its URLs,
    the MLflow tracker (None: not tracking), the rollouts in flight, the run's directory and the
    teacher's side of the evaluation (`Ceiling`; None: no teacher evaluated)."""

    cfg: Config
    env: RolloutEnv
    model: str
    base_urls: list[str]
    tracker: Tracker | None
    concurrency: int
    out_dir: Path
    ceiling: Ceiling | None = None

    @property
    def groups_path(self) -> Path:
        return self.out_dir / "groups.jsonl"


SinkFactory = Callable[[SinkContext], "Sink | None"]
# The project's sinks by name (a name registered twice is refused).
SINKS: Registry[SinkFactory] = Registry("sink", "sinks")


def sink_factory(name: str) -> Callable[[SinkFactory], SinkFactory]:
    """Register the decorated function as the factory of the sink `name`."""
    return SINKS.register(name)


def resolve(name: str) -> SinkFactory:
    """The factory a `sinks` entry names; a ConfigError naming `sinks` (and the nearest sink) when
    there is none."""
    if name in SINKS:
        return SINKS.get(name)
    if ":" not in name:
        raise ConfigError(SINKS.unknown(name, more="; or package.module:factory"), "sinks")
    found = load_object(name, "sinks")
    if not callable(found):
        raise ConfigError(f"sinks: {name!r} is not a factory (a callable taking a SinkContext)", "sinks")
    return found


def build_sinks(names: list[str], ctx: SinkContext) -> list[Sink]:
    """The JSONL file, then each named sink the run uses, in the configured order."""
    from opd.sinks.jsonl import GroupFile

    out: list[Sink] = [GroupFile(ctx.groups_path, fsync=ctx.cfg.runner.fsync)]
    for name in names:
        made = resolve(name)(ctx)
        if made is not None:
            out.append(made)
    return out


@sink_factory("mlflow")
def _mlflow(ctx: SinkContext) -> Sink | None:
    """Per-group metrics and the data artifacts, when tracking."""
    if ctx.tracker is None:
        return None
    from opd.sinks.mlflow import MlflowMetrics

    return MlflowMetrics(ctx.tracker, ctx.groups_path, ctx.env.tokenizer, upload_data=ctx.cfg.tracking.log_data_artifacts)


@sink_factory("atropos")
def _atropos(ctx: SinkContext) -> Sink | None:
    """The Atropos trainer API, with mode=serve or trainer=atropos."""
    if ctx.cfg.mode != "serve" and ctx.cfg.trainer.kind != "atropos":
        return None
    from opd.sinks.atropos import AtroposTrainer

    return AtroposTrainer(ctx.cfg.serve, ctx.cfg.group_size, ctx.cfg.server.max_model_len)


@sink_factory("trainer")
def _trainer(ctx: SinkContext) -> Sink | None:
    """The reference trainer in the run, with trainer=local."""
    if ctx.cfg.trainer.kind != "local":
        return None
    from opd.sinks.trainer import TrainerSink

    return TrainerSink(ctx.cfg.trainer, ctx.env, ctx.model, ctx.base_urls, ctx.out_dir, ctx.tracker, ctx.cfg.server.api_key)


@sink_factory("evaluation")
def evaluation(ctx: SinkContext) -> Sink | None:
    """The held-out evaluation every eval.every groups (and at the start and the end)."""
    if ctx.cfg.eval.every is None:
        return None
    from opd.sinks.evaluation import Evaluator

    return Evaluator(ctx.env, ctx.cfg.eval, ctx.concurrency, ctx.out_dir, ctx.tracker, ctx.ceiling)


@sink_factory("parquet")
def _parquet(ctx: SinkContext) -> Sink | None:
    """The run's records as a dataset (`<run dir>/dataset/groups.parquet`), written when it ends."""
    from opd.sinks.parquet import ParquetExport

    return ParquetExport(ctx.groups_path, ctx.out_dir / "dataset", ctx.cfg.server.model)
