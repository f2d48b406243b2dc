"""Sinks by name: `sinks: [...]` in the config lists, in order, the sinks a run may hand its
groups to after the JSONL file (always first: a group is on disk before anything else sees it).

A name is a registered sink (`@sink_factory("name")`, below for the project's own) or
`package.module:factory` for one of yours, imported at the run's preflight. A factory takes
the run's `SinkContext` and returns the sink, or None where the run does not use it (`mlflow`
without tracking, `trainer` without trainer=local), so the default list serves every mode.

What a sink declares where it is registered (metadata on its registry entry, so that a sink of
yours, registered the same way, declares it too):
- `required_by(cfg)`: why this run needs the sink (None: it does not): a run that needs a sink its
  `sinks` list leaves out is a config error naming `sinks` (`check_sinks`), never a run that ends
  without training, serving or evaluating;
- `settings`: the dataclass of its settings, which the config gives under `sink_settings.<name>`
  (conf/config.yaml) and the factory reads as `ctx.settings`; a key it does not declare is a
  config error naming that key. A sink of yours named `package.module:factory` that registers
  itself (`@sink_factory("mine", ...)` in that module) gets its entry's needs and settings too.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from omegaconf import OmegaConf

from opd.config import Config, ConfigError, load_object
from opd.config.checks import Check, check_tree, checked, fail
from opd.registry import Entry, Registry
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
    # This sink's settings (`sink_settings.<name>`, its declared dataclass); None: it declares none.
    settings: Any = None

    @property
    def groups_path(self) -> Path:
        return self.out_dir / "groups.jsonl"


SinkFactory = Callable[[SinkContext], "Sink | None"]
# Why a run (its config) needs a sink: one line naming what needs it, None where the run does not.
RequiredBy = Callable[[Config], "str | None"]
# The project's sinks by name (a name registered twice is refused), each with what it declared.
SINKS: Registry[SinkFactory] = Registry("sink", "sinks")


def sink_factory(name: str, *, required_by: RequiredBy | None = None, settings: type | None = None) -> Callable[[SinkFactory], SinkFactory]:
    """Register the decorated function as the factory of the sink `name`, with what it declares
    (the module docstring): `required_by`, and `settings`, a dataclass whose fields are the keys of
    `sink_settings.<name>` (a field without a default must be given there)."""
    return SINKS.register(name, required_by=required_by, settings=settings)


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


def entry_of(name: str) -> Entry[SinkFactory] | None:
    """The registry entry of the sink a `sinks` entry names (a `package.module:factory` that
    registered itself: its entry; one that did not: None)."""
    if name in SINKS:
        return SINKS.entry(name)
    return _registered(resolve(name))


def _registered(factory: SinkFactory) -> Entry[SinkFactory] | None:
    """The registry entry whose factory is `factory` (None: it never registered itself)."""
    return next((entry for entry in SINKS.entries() if entry.value is factory), None)


def settings_of(cfg: Config, name: str) -> Any:
    """The registered sink `name`'s settings: `sink_settings.<name>` as the dataclass it declared,
    ranges checked (None where it declares none and none are given). A ConfigError naming the key:
    one it does not declare (with the nearest it does), a value of the wrong type, a field left
    unset, settings for a sink that declares none."""
    given = dict(cfg.sink_settings.get(name) or {})
    schema = SINKS.meta(name, "settings")
    key = f"sink_settings.{name}"
    if schema is None:
        if given:
            raise ConfigError(f"{key}: sink {name} takes no settings, got {', '.join(map(str, given))}", key)
        return None
    declared = [f.name for f in fields(schema)]
    for field_name in given:
        if field_name not in declared:
            close = difflib.get_close_matches(str(field_name), declared, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise ConfigError(f"{key}.{field_name}: sink {name} has no setting {field_name!r}{hint} (its settings: {', '.join(declared) or 'none'})",
                              f"{key}.{field_name}")
    from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

    try:
        typed = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), given))
    except MissingMandatoryValue as err:
        where = f"{key}.{getattr(err, 'full_key', '') or '?'}"
        raise ConfigError(f"{where} must be set: sink {name} has no default for it", where) from None
    except OmegaConfBaseException as err:
        where = f"{key}.{getattr(err, 'full_key', '') or '?'}"
        raise ConfigError(f"{where}: {str(err).splitlines()[0]}", where) from None
    check_tree(typed, key)
    return typed


def check_sinks(cfg: Config) -> None:
    """The config's sinks against what the registered ones declare, before any server starts (at
    the run's preflight, opd.build, and a sweep's start, opd.sweep.callback): each sink a run
    needs (`required_by`) in `sinks`, no `jsonl` there (the file every run writes first is no
    sink), every name a sink, and every `sink_settings` entry a registered sink's settings. Sinks of yours (`package.module:factory`)
    are imported first, so that those that register themselves declare their needs too. The first
    problem is a ConfigError naming its key."""
    listed = {name for name in cfg.sinks if ":" not in name}
    for name in cfg.sinks:
        if ":" in name and (entry := entry_of(name)) is not None:
            listed.add(entry.name)
    for entry in SINKS.entries():
        why = entry.meta["required_by"](cfg) if entry.meta.get("required_by") else None
        if why and entry.name not in listed:
            fail("sinks", f"a list holding {entry.name} ({why})", list(cfg.sinks),
                 f"; add it: sinks=[{','.join([*(s for s in cfg.sinks if s != 'jsonl'), entry.name])}]")
    if "jsonl" in cfg.sinks:
        fail("sinks", "names of sinks after groups.jsonl (always written, first: leave jsonl out)", list(cfg.sinks))
    for name in cfg.sinks:
        resolve(name)
    for name in cfg.sink_settings:
        if name not in SINKS:
            raise ConfigError(SINKS.unknown(str(name), f"sink_settings.{name}"), f"sink_settings.{name}")
        settings_of(cfg, str(name))


def build_sinks(names: list[str], ctx: SinkContext) -> list[Sink]:
    """The JSONL file, then each named sink the run uses, in the configured order, each given its
    settings (`ctx.settings`)."""
    from opd.sinks.jsonl import GroupFile

    out: list[Sink] = [GroupFile(ctx.groups_path, fsync=ctx.cfg.runner.fsync)]
    for name in names:
        factory = resolve(name)  # imported once: a sink of yours by its package.module:factory
        entry = _registered(factory)
        settings = settings_of(ctx.cfg, entry.name) if entry is not None else None
        made = factory(replace(ctx, settings=settings))
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


def _atropos_required(cfg: Config) -> str | None:
    if cfg.mode == "serve":
        return "mode=serve sends the groups to the Atropos API through the atropos sink"
    return "trainer=atropos takes the groups from the atropos sink" if cfg.trainer.kind == "atropos" else None


@sink_factory("atropos", required_by=_atropos_required)
def _atropos(ctx: SinkContext) -> Sink | None:
    """The Atropos trainer API, with mode=serve or trainer=atropos."""
    if ctx.cfg.mode != "serve" and ctx.cfg.trainer.kind != "atropos":
        return None
    from opd.sinks.atropos import AtroposTrainer

    return AtroposTrainer(ctx.cfg.serve, ctx.cfg.group_size, ctx.cfg.server.max_model_len)


@sink_factory("trainer", required_by=lambda cfg: "trainer=local trains on the groups the trainer sink hands it" if cfg.trainer.kind == "local" else None)
def _trainer(ctx: SinkContext) -> Sink | None:
    """The reference trainer in the run, with trainer=local."""
    if ctx.cfg.trainer.kind != "local":
        return None
    from opd.sinks.trainer import TrainerSink

    return TrainerSink(ctx.cfg.trainer, ctx.env, ctx.model, ctx.base_urls, ctx.out_dir, ctx.tracker, ctx.cfg.server.api_key)


@sink_factory("evaluation", required_by=lambda cfg: f"eval.every={cfg.eval.every} evaluates through the evaluation sink"
               if cfg.eval.every is not None and cfg.mode != "evaluate" else None)
def evaluation(ctx: SinkContext) -> Sink | None:
    """The held-out evaluation every eval.every groups (and at the start and the end)."""
    if ctx.cfg.eval.every is None:
        return None
    from opd.sinks.evaluation import Evaluator

    return Evaluator(ctx.env, ctx.cfg.eval, ctx.concurrency, ctx.out_dir, ctx.tracker, ctx.ceiling)


def _inside(path: str) -> bool:
    parts = Path(path).parts
    return bool(parts) and not Path(path).is_absolute() and ".." not in parts


@dataclass
class ParquetSettings:
    """`sink_settings.parquet` (its values and their comments: conf/config.yaml)."""

    dir: str = checked(Check("a folder inside the run's directory (a relative path without '..')", _inside))


@sink_factory("parquet", settings=ParquetSettings)
def _parquet(ctx: SinkContext) -> Sink | None:
    """The run's records as a dataset (`<run dir>/<dir>/groups.parquet`), written when it ends."""
    from opd.sinks.parquet import ParquetExport

    return ParquetExport(ctx.groups_path, ctx.out_dir / ctx.settings.dir, ctx.cfg.server.model)
