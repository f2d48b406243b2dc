"""The checks atroposlib's commands get before atroposlib is imported.

Importing atroposlib takes 5-15 s here (torch, transformers, scikit-learn), and its `BaseEnv`
then loads `--env.tokenizer_name` with transformers, which retries an unreachable hub for about
two minutes before a 60-line traceback. So `python -m opd.atropos.<env> serve|process|evaluate`
first reads the options it can check from its own command line (and its `--config` YAML, which
the command line overrides, as atroposlib merges them): the tokenizer is found (a local
directory, a cached hub model or one the hub gives now, `opd.serving.model_lookup`) and each
`--openai.base_url` answers and serves `--openai.model_name`. A failure is one line naming the
option, within seconds (`opd.cli.fail`). What is not on the command line (atroposlib's defaults
are ours) is checked again, in full, when the environment is built (`AtroposEntry.preflight`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from opd.cli import fail
from opd.config import ConfigError

# atroposlib's subcommands that build an environment.
COMMANDS = ("serve", "process", "evaluate")


def given_options(argv: list[str]) -> dict[str, str]:
    """{option without its dashes: value} for `--name value` and `--name=value` in `argv` (the
    last one wins, as with argparse)."""
    found: dict[str, str] = {}
    for index, word in enumerate(argv):
        if not word.startswith("--"):
            continue
        name, equals, value = word[2:].partition("=")
        if equals:
            found[name] = value
        elif index + 1 < len(argv) and not argv[index + 1].startswith("--"):
            found[name] = argv[index + 1]
    return found


def _from_yaml(path: str) -> dict[str, str]:
    """The options a `--config` YAML sets, as `env.x` / `openai.x` names (one server only)."""
    import yaml

    try:
        loaded: Any = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"--config={path!r}: cannot be read as YAML ({str(err).splitlines()[0]})", "--config") from None
    found: dict[str, str] = {}
    if not isinstance(loaded, dict):
        return found
    for namespace in ("env", "openai"):
        section = loaded.get(namespace)
        if isinstance(section, list) and len(section) == 1:
            section = section[0]
        if isinstance(section, dict):
            found.update({f"{namespace}.{key}": str(value) for key, value in section.items() if isinstance(value, (str, int, float))})
    return found


def check(argv: list[str]) -> None:
    """Raise a ConfigError naming the option for a tokenizer that cannot be had or a server that
    does not answer (nothing for `--help` or a command that builds no environment)."""
    if not argv or argv[0] not in COMMANDS or {"-h", "--help"} & set(argv):
        return
    given = given_options(argv[1:])
    options = {**(_from_yaml(given["config"]) if "config" in given else {}), **given}
    if "env.tokenizer_name" in options:
        from opd.serving.model_lookup import find_model

        find_model(options["env.tokenizer_name"], "--env.tokenizer_name")
    if "openai.base_url" in options:
        from opd.serving.watch import check_servers

        check_servers([options["openai.base_url"]], options.get("openai.model_name"), "--openai.base_url", "--openai.model_name")


def main(argv: list[str]) -> None:
    """`check(argv)`, stopping the command with its one line on failure."""
    try:
        check(argv)
    except ConfigError as err:
        fail(str(err))
