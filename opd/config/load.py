"""Composing the config tree and turning it into the typed, checked schema.

The YAML tree in `conf/` is the one source of every value and of the comment that explains it;
the dataclasses of this package give the types (OmegaConf checks them, and unknown keys, when
Hydra composes the config, naming the full key) and the ranges and combinations (`validate`
checks them once, walking the typed tree, before any server starts). No field has a default:
a value missing from the YAML is an error, not a silent default. Code outside a Hydra run gets
a config with `compose(overrides)`.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from opd.config.checks import ConfigError, check_tree
from opd.config.root import SCHEMAS, Config

CONF_DIR = Path(__file__).resolve().parent.parent.parent / "conf"

# The project's root: relative paths in the config (e.g. model.chat_template) are read from here
# when they are not found from the working directory.
PROJECT_ROOT = Path(__file__).resolve().parent.parent.parent


def project_path(path: str) -> Path:
    """`path` as given when it exists (or is absolute), else relative to the project's root."""
    given = Path(path).expanduser()
    return given if given.is_absolute() or given.exists() else PROJECT_ROOT / given


def register() -> None:
    """Register the root schema and each group's schemas with Hydra's ConfigStore, and the
    `opd.run_dir` resolver that `output_dir` reads."""
    store = ConfigStore.instance()
    for group, schemas in SCHEMAS.items():
        for name, node in schemas.items():
            store.store(group=group, name=name, node=node)
    OmegaConf.register_new_resolver("opd.run_dir", run_dir, replace=True)


def run_dir() -> str:
    """This run's directory: Hydra's, once the run has started; before that (`--cfg job --resolve`,
    `--help`) the directory a run started now would get (hydra.run.dir)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        raise ConfigError("output_dir: no Hydra run to take it from; pass output_dir=DIR", "output_dir")
    hydra = HydraConfig.get()
    started = OmegaConf.select(hydra, "runtime.output_dir")
    return str(started) if started else str(Path(str(hydra.run.dir)).absolute())


def compose(overrides: list[str] | None = None, hydra: bool = False) -> DictConfig:
    """The config tree composed as a launch would compose it (for code and tests outside a Hydra
    run); `output_dir` is a placeholder unless overridden. `hydra=True` keeps the `hydra` node."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=["output_dir=outputs/unused", *(overrides or [])], return_hydra_config=hydra)


_KNOB = re.compile(r"^\$\{(\w+)\}$")


def _knobs(tree: Any, prefix: str = "") -> dict[str, str]:
    """{nested key: top-level knob} for every value that is exactly `${knob}`."""
    found: dict[str, str] = {}
    if isinstance(tree, dict):
        for key, value in tree.items():
            found.update(_knobs(value, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(tree, str) and (match := _KNOB.match(tree)) and "." in prefix:
        found[prefix] = match.group(1)
    return found


def validate(cfg: DictConfig) -> Config:
    """Resolve the composed config and run every range check; raises ConfigError naming the key.

    An error about a value that came from a top-level knob (`env.opd.topk: ${distill_topk}`)
    names the knob the user typed."""
    from omegaconf.errors import MissingMandatoryValue

    raw = OmegaConf.to_container(cfg, resolve=False)
    try:
        typed = OmegaConf.to_object(cfg)
    except MissingMandatoryValue as err:
        key = str(getattr(err, "full_key", "") or "?")
        raise ConfigError(f"{key} must be set: {_REQUIRED.get(key, f'{key}=VALUE')}", key) from None
    if not isinstance(typed, Config):
        raise ConfigError(f"the composed config is not the Config schema but {type(typed).__name__}")
    if isinstance(typed.env, dict):  # an environment of yours: its schemas come with its spec (opd.envs.registry)
        if not typed.env.get("spec"):
            raise ConfigError(f"env.name: environment {typed.env.get('name')!r} has no schema; an environment of yours names its "
                              "EnvSpec: env.spec=package.module:SPEC", "env.spec")
        spec = load_object(str(typed.env["spec"]), "env.spec")
        typed.env = _typed("env", getattr(spec, "env_schema", None), typed.env)
        if isinstance(typed.reward, dict):
            typed.reward = _typed("reward", getattr(spec, "reward_schema", None), typed.reward)
    try:
        check_tree(typed)
    except ConfigError as err:
        knob = _knobs(raw).get(err.key or "")
        if knob is None:
            raise
        raise ConfigError(f"{str(err).replace(err.key or '', knob, 1)} (it sets {err.key})", knob) from None
    # `+key=value` overrides bypass the schema at composition; to_object would drop them silently.
    known = set(_leaf_keys(typed))
    unknown = sorted(set(_leaf_keys(raw)) - known)
    if unknown:
        import difflib

        named = []
        for key in unknown:
            close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
            named.append(f"{key} (did you mean {close[0]}?)" if close else key)
        raise ConfigError(f"unknown config key(s): {', '.join(named)}; not in the schema", unknown[0])
    return typed


def load_object(path: str, key: str) -> Any:
    """The object `package.module:attr` names (a config value naming code of yours); a ConfigError
    naming `key` when it cannot be imported."""
    import importlib

    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ConfigError(f"{key}: {path!r} is not package.module:attr", key)
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"{key}: cannot load {path!r}: {type(err).__name__}: {err}", key) from None


def _typed(key: str, schema: type | None, values: dict[str, Any]) -> Any:
    """`values` (an untyped config node) as `schema`'s dataclass; a ConfigError naming the key for
    a missing schema, an unknown field or a wrong type (`validate` checks its ranges with the rest)."""
    from omegaconf.errors import OmegaConfBaseException

    if schema is None:
        raise ConfigError(f"{key}: env.spec declares no {key} schema for this untyped {key} config", key)
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), values))
    except OmegaConfBaseException as err:
        where = getattr(err, "full_key", "") or "?"
        raise ConfigError(f"{key}.{where}: {str(err).splitlines()[0]}", f"{key}.{where}") from None


# What to type for a value the config leaves to the user (`???` in conf/).
_REQUIRED = {
    "server.model": "server=vllm needs the model name its servers serve: server.model=NAME",
    "server.base_urls": "server=vllm needs its servers' addresses: server.base_urls=[http://host:8000/v1]",
    "judge.base_url": "judge=server needs its server's address: judge.base_url=http://host:8000/v1",
    "judge.model": "judge=server needs the model name its server serves: judge.model=NAME",
    "teacher.server.model": "teacher=model needs its model: teacher.server.model=DIR_OR_NAME (a base_url's served name, or one the run serves)",
}


def _leaf_keys(tree: Any, prefix: str = "") -> list[str]:
    """The dotted leaf keys of a config tree: a container's dicts, or a typed config's dataclasses
    (read off them: building `OmegaConf.structured(typed)` to list its keys took two thirds of
    `validate`)."""
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        tree = {f.name: getattr(tree, f.name) for f in dataclasses.fields(tree)}
    if not isinstance(tree, dict) or not tree:
        return [prefix]
    keys: list[str] = []
    for key, value in tree.items():
        keys += _leaf_keys(value, f"{prefix}.{key}" if prefix else str(key))
    return keys
