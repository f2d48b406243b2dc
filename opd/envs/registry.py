"""Environments by name: what the framework needs of one, declared once (`EnvSpec`).

The project's own are registered below. One of yours needs no framework edit: put
`conf/env/<name>.yaml` (with `spec: package.module:SPEC`, your `EnvSpec`), `conf/reward/<name>.yaml`
and `conf/dataset/<name>_default.yaml` in a config directory of yours and run with
`hydra.searchpath=[file:///that/dir] env=<name>`. Its config and reward schemas (dataclasses; the
env's a subclass of `opd.config.EnvConfig`) are checked like ours.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from opd.config import Config, ConfigError, load_object
from opd.registry import Registry

if TYPE_CHECKING:
    from opd.data.sources import TaskSet
    from opd.envs.base import RolloutEnv


@dataclass(frozen=True)
class EnvSpec:
    """One environment: its class, where its data comes from, its config schemas and what its
    constructor takes beyond the arguments every environment gets."""

    name: str
    # "package.module:Class", a subclass of opd.envs.base.RolloutEnv (imported when it is built).
    env_class: str
    # (the run's config) -> TaskSet: the train and held-out items.
    load_data: Callable[[Config], "TaskSet"]
    # The dataclasses of env.* and reward.* (None: the ones registered with Hydra, the built-ins').
    env_schema: type | None = None
    reward_schema: type | None = None
    # (the run's config, the common keyword arguments, the judge's pool) -> (args, kwargs) of the
    # constructor; None: (cfg.env, cfg.reward) and the common ones.
    arguments: Callable[[Config, dict[str, Any], Any], tuple[tuple, dict[str, Any]]] | None = None

    def environment_class(self) -> type[RolloutEnv]:
        return load_object(self.env_class, "env.spec")

    def constructor_arguments(self, cfg: Config, common: dict[str, Any], judge: Any = None) -> tuple[tuple, dict[str, Any]]:
        if self.arguments is not None:
            return self.arguments(cfg, common, judge)
        return (cfg.env, cfg.reward), common


def drop_equal_scores(cfg: Config) -> bool:
    """`env.drop_equal_scores`; null: as atroposlib, drop when groups go to an Atropos trainer
    (its `serve` drops them, its `process` keeps them)."""
    value = getattr(cfg.env, "drop_equal_scores", None)
    return value if value is not None else cfg.mode == "serve" or cfg.trainer.kind == "atropos"


def _math_data(cfg: Config) -> TaskSet:
    from opd.data.math_sets import load_math

    if cfg.dataset.source == "humaneval":
        raise ConfigError("dataset.source: humaneval holds coding tasks; env=inline_math needs math problems", "dataset.source")
    return load_math(cfg.dataset)


def _coding_data(cfg: Config) -> TaskSet:
    from opd.data.coding_sets import load_coding

    return load_coding(cfg.dataset)


# The project's environments by env.name (a name registered twice is refused).
ENVS: Registry[EnvSpec] = Registry("environment", "env.name")
ENVS.add("inline_math", EnvSpec("inline_math", "opd.envs.inline_math:InlineMathEnv", _math_data,
                                arguments=lambda cfg, common, judge: ((cfg.env, cfg.reward), {"drop_equal_scores": drop_equal_scores(cfg), **common})))
ENVS.add("opd_coding", EnvSpec("opd_coding", "opd.envs.opd_coding:OPDCodingEnv", _coding_data,
                               arguments=lambda cfg, common, judge: ((cfg.env, cfg.reward, cfg.judge), {"judge_pool": judge, **common})))


def spec_of(env: Any) -> EnvSpec:
    """The spec of a config's `env` node (a schema's dataclass or, for yours before it is typed,
    a dict): `env.spec` when set, else the registered one of `env.name`."""
    get = env.get if isinstance(env, dict) else lambda key, default=None: getattr(env, key, default)
    path, name = get("spec"), get("name")
    if path:
        found = load_object(str(path), "env.spec")
        if not isinstance(found, EnvSpec):
            raise ConfigError(f"env.spec: {path!r} is not an opd.envs.registry.EnvSpec", "env.spec")
        return found
    if name in ENVS:
        return ENVS.get(name)
    raise ConfigError(ENVS.unknown(str(name), more="; or env.spec=package.module:SPEC"), "env.name")
