"""The command line's side of Hydra: a bad input is one line naming what the user typed (with the
nearest key or option when it is a typo), `--help` lists the groups and knobs a user chooses from,
and third-party chatter stays out of the console (it still reaches the run's log).

Hydra prints composition errors itself, over several lines (and a stack trace for an error it does
not know); `report_errors()` puts a reporter in front of Hydra's for the errors a user causes and
leaves every other error to Hydra (`HYDRA_FULL_ERROR=1` still shows everything).
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
import re
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable, Iterable, NoReturn

from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

from opd.config import CONF_DIR, ConfigError
from opd.run_files import RunFileError, make_dir, replace_file

# Options that other configs choose (a group's base, an env's default dataset) and groups that
# are parts of other groups: not choices a user makes on the command line.
_INTERNAL_OPTIONS = {"dataset": {"base", "inline_math_default", "opd_coding_default"}}
_INTERNAL_GROUPS = {"sandbox", "hydra"}
# Loggers whose INFO lines are ours; anything else below WARNING goes to the log file only.
_OWN_LOGGERS = ("opd", "experiments", "__main__")

logger = logging.getLogger(__name__)


# ---- the one error style of every command ----------------------------------------------------


def error_line(message: str) -> str:
    """`error: <message>` on one line (a message's own line breaks become spaces): how every
    command of this project tells its user why it stopped."""
    return "error: " + " ".join(str(message).split())


def say_error(message: str, log: bool = True) -> str:
    """Write `error_line(message)` to stderr at once, and (with `log`) to the run's log file when
    this process logs to one (not to the console a second time); the line."""
    line = error_line(message)
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
    if log and log_path() is not None:
        logger.error("%s", line, extra={"file_only": True})
    return line


def fail(message: str, status: int = 2, log: bool = True) -> NoReturn:
    """Stop the command with `say_error(message, log)` and exit `status` (2: a bad input, found
    before any work started; 1: the work failed)."""
    say_error(message, log)
    raise SystemExit(status)


class JobFailed(RuntimeError):
    """A sweep job failed; its message is the one line its console and its log showed when it
    failed (the job's own error is the cause, its traceback in the job's log). The launcher
    reports it as that line at the end of the sweep instead of Hydra's traceback."""


def nearest(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate closest to a mistyped `word` (None when nothing is close)."""
    found = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return found[0] if found else None


def user_options(group: str, options: Iterable[str]) -> list[str]:
    """A group's options as a user chooses them: no schemas, bases or other configs' defaults."""
    hidden = _INTERNAL_OPTIONS.get(group, set())
    return sorted(o for o in options if not o.endswith("_schema") and o not in hidden)


def user_groups() -> dict[str, list[str]]:
    """{group: its options} for every group a user chooses from (conf/ plus Hydra's launchers)."""
    groups = {}
    for folder in sorted(p for p in CONF_DIR.iterdir() if p.is_dir() and p.name not in _INTERNAL_GROUPS):
        groups[folder.name] = user_options(folder.name, (p.stem for p in folder.glob("*.yaml")))
    launchers = ["basic", *(p.stem for p in (CONF_DIR / "hydra" / "launcher").glob("*.yaml"))]
    try:
        import hydra_plugins.hydra_joblib_launcher  # noqa: F401

        launchers.append("joblib")
    except ImportError:
        pass
    groups["hydra/launcher"] = sorted(launchers)
    return groups


# ---- one line per bad input ----------------------------------------------------------------


def _schema_keys(object_type: Any) -> list[str]:
    return [f.name for f in dataclasses.fields(object_type)] if dataclasses.is_dataclass(object_type) else []


def _did_you_mean(full_key: str, object_type: Any) -> str:
    """`; did you mean env.max_tool_calls?` for the mistyped last part of `full_key` (or '')."""
    parent, _, name = full_key.rpartition(".")
    match = nearest(name, _schema_keys(object_type))
    return f"; did you mean {parent + '.' if parent else ''}{match}?" if match else ""


def _override_of(key: str, overrides: Iterable[str]) -> str:
    for override in overrides:
        typed = override.lstrip("+~").split("=", 1)[0]
        if typed == key or typed.startswith(key + "."):
            return override
    return key


def composition_error(err: BaseException, overrides: list[str]) -> str | None:
    """One line for an error Hydra raised while composing the config from `overrides` (None: not
    an error of the user's input)."""
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

    if isinstance(err, MissingConfigException) and err.missing_cfg_file and "/" in err.missing_cfg_file:
        group, _, option = err.missing_cfg_file.rpartition("/")
        options = user_options(group, err.options or [])
        if not options:
            return None
        match = nearest(option, options)
        hint = f"; did you mean {group}={match}?" if match else ""
        return f"{group}={option}: no such option{hint} ({group} is one of: {', '.join(options)})"
    if isinstance(err, OverrideParseException):
        first = str(err).splitlines()[0]
        return f"cannot read the override: {first} (Hydra's override grammar: key=value, key=[a,b], 'quoted value')"
    if not isinstance(err, ConfigCompositionException):
        return None
    cause = err.__cause__
    if isinstance(cause, OmegaConfBaseException):
        full_key = str(getattr(cause, "full_key", "") or "")
        typed = _override_of(full_key, overrides)
        if isinstance(cause, (ConfigKeyError, ConfigAttributeError)):
            # "Key 'x' not in 'Y'": full_key ends at the first part the schema does not have.
            key = full_key or typed.split("=", 1)[0]
            hint = _did_you_mean(key, getattr(cause, "object_type", None))
            return f"{typed}: {key} is not a config key{hint} (`--cfg job` shows every key)"
        if isinstance(cause, ValidationError):
            message = str(cause).splitlines()[0]
            return f"{typed}: {message} (the type of {full_key or 'this key'})"
        return f"{typed}: {str(cause).splitlines()[0]}"
    clash = _clash(str(err), overrides)
    if clash:
        return clash
    first = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
    return first or None


# Hydra's message when a config file it merges sets a key the selected schema lacks.
_FILE_KEY_ERROR = re.compile(r"^In '(?P<group>[\w.-]+)/(?P<option>[\w.-]+)': ConfigKeyError raised while composing config:"
                             r".*?full_key: (?P<key>\S+)", re.S)


def _clash(message: str, overrides: Iterable[str]) -> str | None:
    """`arm=grpo sets trainer.loss, which trainer=atropos does not have; ...` for a config file
    (one a user chose) that sets a key of another group whose option, chosen too, lacks it: two
    choices that do not go together, named as typed. None for any other message."""
    found = _FILE_KEY_ERROR.match(message)
    if not found:
        return None
    group, option, key = found["group"], found["option"], found["key"]
    owner = key.split(".", 1)[0]
    if owner == group:  # a file's own group lacks the key: a mistake in that file, not a clash
        return None
    chosen = next((o.lstrip("+") for o in overrides if o.lstrip("+").split("=", 1)[0] == owner), None)
    if chosen is None:
        return None
    wanted = _selects(group, option, owner)
    needs = f"{group}={option} selects {owner}={wanted}" if wanted else f"{group}={option} is written for another {owner}"
    return f"{group}={option} sets {key}, which {chosen} does not have; {needs}: choose one of the two"


def _selects(group: str, option: str, other: str) -> str | None:
    """The option of group `other` that conf/<group>/<option>.yaml's defaults select (or None)."""
    path = CONF_DIR / group / f"{option}.yaml"
    if not path.is_file():
        return None
    defaults = OmegaConf.load(path).get("defaults") or []
    for entry in defaults:
        if isinstance(entry, str) or not hasattr(entry, "items"):
            continue
        for name, value in entry.items():
            if str(name).removeprefix("override ").strip("/") == other:
                return str(value)
    return None


def unwritable(directory: Path) -> str | None:
    """Why `directory` cannot be made (None: it can). Nothing is left behind: the check makes and
    removes a probe directory in the nearest existing ancestor (a root user passes permission bits,
    so only trying tells)."""
    import tempfile

    existing = directory.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a directory"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".opd-probe-", dir=existing))
    except OSError as err:
        return f"{existing}: {err.strerror}"
    return None


class OutputDirCheck(Callback):
    """A Hydra callback (hydra.callbacks.output_dir): a run or sweep directory that cannot be made
    stops the command with one line before anything starts (Hydra would print its traceback when it
    makes the directory; an error raised in a callback it only warns about, hence the exit)."""

    def _check(self, config: Any, node: str, key: str) -> None:
        directory = Path(str(OmegaConf.select(config, f"hydra.{node}.dir")))
        why = unwritable(directory)
        if why is None:
            return
        typed = [o.split("=", 1)[0] for o in (*config.hydra.overrides.hydra, *config.hydra.overrides.task)]
        named = next((k for k in (key, "output_root") if k in typed), "output_root")
        fail(f"{named}: cannot create {directory}: {why}; choose a writable place with output_root=DIR "
             f"(runs, sweeps and the MLflow store go under it) or {key}=DIR")

    def on_run_start(self, config: Any, **kwargs: Any) -> None:
        self._check(config, "run", "hydra.run.dir")

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        self._check(config, "sweep", "hydra.sweep.dir")



def user_error(err: BaseException, overrides: list[str]) -> str | None:
    """The one line a user reads for `err`, or None when it is not a bad input (Hydra reports it)."""
    if isinstance(err, ConfigError):
        return str(err)
    if isinstance(err, JobFailed):
        return str(err)
    cause: BaseException | None = err
    while cause is not None:  # a run directory's file refused, also under logging's "Unable to configure handler"
        if isinstance(cause, RunFileError):
            return str(cause)
        cause = cause.__cause__
    return composition_error(err, overrides)


def guard_hydra_files() -> None:
    """Hydra writes `<run dir>/.hydra/{config,hydra,overrides}.yaml` by name before a run starts
    (it would follow a link planted there, or wait on a FIFO): make it write them as every file of
    a run directory is written (`opd.run_files`: a directory of its own, a fresh name renamed over
    the old file, a link or a FIFO in its place refused). The run's log is `opd.run_files.LogFile`
    (conf/hydra/job_logging/opd.yaml)."""
    import hydra.core.utils as hydra_utils

    if getattr(hydra_utils._save_config, "opd_guarded", False):
        return

    def save_config(cfg: Any, filename: str, output_dir: Path) -> None:
        replace_file(make_dir(output_dir) / filename, OmegaConf.to_yaml(cfg))

    save_config.opd_guarded = True  # type: ignore[attr-defined]
    hydra_utils._save_config = save_config


def report_errors() -> None:
    """Put `user_error` in front of Hydra's error reporting for this process: a bad input prints
    one line (`error: ...`) and exits with status 2, a failed sweep job its line with status 1;
    anything else is Hydra's to report."""
    import hydra._internal.utils as hydra_utils

    hydra_report: Callable[[Callable[[], Any]], Any] = hydra_utils.run_and_report
    if getattr(hydra_report, "opd_reporter", False):
        return
    overrides = [a for a in sys.argv[1:] if not a.startswith("-")]

    def run_and_report(func: Callable[[], Any]) -> Any:
        try:
            return func()
        except Exception as err:  # noqa: BLE001 - every error is reported, here or by Hydra
            line = None if os.environ.get("HYDRA_FULL_ERROR") == "1" else user_error(err, overrides)
            if line is None:
                def again() -> Any:
                    raise err
                return hydra_report(again)
            # Not into a log file: after a sweep, the last job's log may still be open here.
            fail(line, 1 if isinstance(err, JobFailed) else 2, log=False)

    run_and_report.opd_reporter = True  # type: ignore[attr-defined]
    hydra_utils.run_and_report = run_and_report


# ---- --help -----------------------------------------------------------------------------


def _knob_comments() -> dict[str, str]:
    """{top-level scalar key of conf/config.yaml: the comment above it, joined}."""
    comments: dict[str, str] = {}
    block: list[str] = []
    for line in (CONF_DIR / "config.yaml").read_text().splitlines():
        if line.startswith("#"):
            block.append(line.lstrip("# ").strip())
        elif re.match(r"^\w+:\s*\S", line):
            comments[line.split(":", 1)[0]] = " ".join(block)
            block = []
        else:
            block = []
    return comments


def help_text(_root_: Any) -> str:
    """The groups (with this command line's choices marked) and the top-level knobs (with their
    values), for the `--help` template (conf/hydra/help/opd.yaml)."""
    choices = OmegaConf.select(_root_, "hydra.runtime.choices") or {}
    lines = [
        str(OmegaConf.select(_root_, "hydra.help.header")), "",
        "  python -m experiments.launch env=opd_coding distill_topk=20     # a run: local vLLM, the fixture model",
        "  python -m experiments.launch -m reward.weights.correct=0.5,1.0  # a sweep: an MLflow parent run, a child per job",
        "  python -m experiments.launch --cfg job --resolve [overrides]    # the whole config with its values",
        "", "Any key can be set (env.max_tool_calls=5); a mistyped key or option is an error naming the nearest.", "",
        "== Groups: group=option (* this command's choice) ==",
    ]
    groups = user_groups()
    width = max(map(len, groups))
    for group, options in groups.items():
        chosen = str(choices.get(group, "")) if group in choices else ""
        marked = [f"{o}*" if o == chosen else o for o in options]
        lines.append(f"{group.ljust(width)}  {', '.join(marked)}")
    lines += ["", "== Top-level knobs: key=value (this command's values) =="]
    comments = _knob_comments()
    for key, comment in comments.items():
        value = OmegaConf.select(_root_, key, throw_on_missing=False)
        shown = f"{key}={str(value).lower() if isinstance(value, bool) else value}" if key != "output_dir" else "output_dir=<the run's directory>"
        lines.append(shown)
        lines += textwrap.wrap(comment, 96, initial_indent="    ", subsequent_indent="    ")
    lines += ["", str(OmegaConf.select(_root_, "hydra.help.footer"))]
    return "\n".join(lines).replace("$", "$$")  # Hydra fills the template with string.Template


def register_help() -> None:
    """The `opd.help` resolver that conf/hydra/help/opd.yaml's template reads."""
    OmegaConf.register_new_resolver("opd.help", help_text, replace=True)


# ---- the console ------------------------------------------------------------------------


class ConsoleFilter(logging.Filter):
    """The console shows our own lines and everyone's warnings; other libraries' INFO and DEBUG
    lines (vLLM's Triton notice, Ray, MLflow) go to the run's log file only."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "file_only", False):
            return False
        if record.levelno >= logging.WARNING:
            return True
        return record.name.split(".", 1)[0] in _OWN_LOGGERS


def log_path() -> Path | None:
    """The run's log file (Hydra's file handler), if logging to one."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            return Path(handler.baseFilename)
    return None
