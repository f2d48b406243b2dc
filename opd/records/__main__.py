"""`python -m opd.records check FILE [FILE ...]`: check every group of record files (exit 1 on any
problem); with `--rerender`, also render each rollout's conversation with the chat template of the
model that wrote it and report where the ids differ (`opd.envs.rerender`);
`python -m opd.records view FILE [--tokenizer DIR] [--out HTML]`: write its viewer;
`python -m opd.records export FILE|RUN_DIR --format parquet|jsonl --out DIR`: one row per rollout,
for `datasets.load_dataset` and trainers (`opd.records.export`, docs/records.md).

All three read with `opd.records.reader` (the reader resume uses too, with the same limits; the flags
below change them for one command) and print one line per problem, naming the file and the line,
with control and bidi characters from the file escaped. A file that is not there, a tokenizer that
cannot be had or a page that cannot be written stops the command with one line (`error: ...`),
before anything is read."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from pathlib import Path
from typing import Any

from opd.cli import fail
from opd.records.escape import console
from opd.records.reader import LIMITS, Limits, digest, is_gzip, read_groups, records
from opd.records.rules import check_group
from opd.run_files import open_file

logger = logging.getLogger("opd.records")
# Problems listed per file before the check stops there (a file of a million bad lines is one
# problem a million times).
MAX_PROBLEMS = 1000
# The fixture model's directory (opd/fixture/model), named by path: opd.fixture is a higher layer.
FIXTURE_MODEL = Path(__file__).resolve().parents[1] / "fixture" / "model"


def check_file(path: Path, limits: Limits = LIMITS, follow: bool = True) -> tuple[int, list[str]]:
    """(groups read, problems as `line L: ...` or `line L: group N: ...` strings, escaped). A
    line the reader refuses is a problem and the check goes on after it, unless the file cannot be
    read further (a line past the cap, a decompression bomb) or `MAX_PROBLEMS` are listed; a group
    equal to an earlier one (whatever its key order or spacing) is a problem: resume keeps one of
    them."""
    problems: list[str] = []
    count = 0
    seen: dict[bytes, int] = {}
    try:
        with open_file(path, "rb", follow=follow) as handle:
            for record in records(handle, is_gzip(path), limits):
                if record.problem is not None:
                    problems.append(f"line {record.number}: {console(record.problem)}")
                    if record.fatal or len(problems) >= MAX_PROBLEMS:
                        break
                    continue
                if record.blank:
                    continue
                count += 1
                problems += [f"line {record.number}: group {count}: {console(p)}" for p in check_group(record.value)]
                fingerprint = digest(record.value)
                if fingerprint in seen:
                    problems.append(f"line {record.number}: group {count}: a duplicate of the group on line {seen[fingerprint]}")
                else:
                    seen[fingerprint] = record.number
                if len(problems) >= MAX_PROBLEMS:
                    problems.append(f"line {record.number}: {len(problems)} problems; the check stopped here")
                    break
    except OSError as err:
        problems.append(console(str(err)))
    return count, problems


def _check(paths: list[Path], limits: Limits, rerender: bool = False, config: Path | None = None, tokenizer: Path | None = None) -> int:
    for path in paths:
        _readable(path)
    if config is not None and not config.is_file():
        fail(f"--config={console(str(config))!r}: no such file; give the run's config.yaml")
    if tokenizer is not None and not tokenizer.is_dir():
        fail(f"--tokenizer={console(str(tokenizer))!r}: no such directory; give the model's tokenizer directory")
    failed = False
    for path in paths:
        count, problems = check_file(path, limits)
        for problem in problems:
            logger.error("%s: %s", console(str(path)), problem)
        logger.info("%s: %d groups, %d problems", console(str(path)), count, len(problems))
        failed |= bool(problems) or count == 0
        if rerender and count and not problems:  # a file that breaks the format's rules is not re-rendered
            failed |= _rerender(path, config or path.parent / "config.yaml", tokenizer, limits) != 0
    return 1 if failed else 0


def rerender_file(path: Path, config: Path, tokenizer: Path | None = None, limits: Limits = LIMITS) -> tuple[list[str], list[str]]:
    """(errors, notes) of re-rendering every rollout of `path` with the chat template of the run
    whose config is `config`: errors where the prompt or inserted ids are not the template's,
    notes where the template re-renders a sampled turn otherwise (`opd.agent.rerender`)."""
    # The comparison knows the environments' tools: it lives above the records' layer.
    from opd.build import resolve_model
    from opd.config import ConfigError
    from opd.envs.rerender import Renderer, RerenderError, rerender_group

    try:
        renderer = Renderer.for_run(config, tokenizer, resolve_model)
    except (RerenderError, ConfigError) as err:
        return [str(err)], []
    errors: list[str] = []
    notes: list[str] = []
    try:
        for number, group in enumerate(read_groups(path, limits, follow=True), 1):
            for index, difference in rerender_group(group, renderer):
                where = f"group {number}" + (f" rollout {index}" if index >= 0 else "")
                (errors if difference.error else notes).append(f"{where}: {difference.describe(renderer.tokenizer)}")
    except (ValueError, OSError) as err:
        errors.append(str(err))
    return errors, notes


# Notes shown per file (the rest are counted): a family whose template re-renders every sampled
# turn otherwise has some in every rollout.
MAX_NOTES_SHOWN = 10


def _rerender(path: Path, config: Path, tokenizer: Path | None, limits: Limits) -> int:
    errors, notes = rerender_file(path, config, tokenizer, limits)
    shown = console(str(path))
    for error in errors:
        logger.error("%s: %s", shown, console(error))
    for note in notes[:MAX_NOTES_SHOWN]:
        logger.info("%s: %s", shown, console(note))
    if len(notes) > MAX_NOTES_SHOWN:
        logger.info("%s: ... and %d more places in sampled turns the template renders otherwise", shown, len(notes) - MAX_NOTES_SHOWN)
    logger.info("%s: re-rendered with the chat template of the run of %s: %d differences from it in prompts or inserted text, "
                "%d places in sampled turns it renders otherwise", shown, console(str(config)), len(errors), len(notes))
    return 1 if errors else 0


def _readable(path: Path) -> None:
    """Stop with one line (`error: ...`, status 2) unless `path` is a file there is to read."""
    if not path.exists():
        fail(f"{console(str(path))}: no such file")
    if path.is_dir():
        fail(f"{console(str(path))} is a directory; give a records file (groups.jsonl or groups.jsonl.gz)")


def _cached(name: str) -> bool:
    """Whether hub model `name` has its tokenizer in the local Hugging Face cache (no network)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return any(isinstance(try_to_load_from_cache(name, file), str) for file in ("tokenizer.json", "tokenizer_config.json"))
    except Exception:  # noqa: BLE001 - not a hub name at all
        return False


def load_tokenizer(name: str) -> Any:
    """The tokenizer of `--tokenizer`: a local directory or a hub model already in the local cache,
    looked up without the network and before transformers is imported (it would retry an
    unreachable hub for minutes); else one line naming `--tokenizer` and what to do."""
    advice = "give the directory of the model that wrote the records (its tokenizer.json), or download it first (huggingface-cli download NAME)"
    if not Path(name).is_dir() and not _cached(name):
        fail(f"--tokenizer={console(name)!r} is not a directory nor a hub model in the local Hugging Face cache: {advice}")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name, local_files_only=True)
    except (OSError, ValueError) as err:
        fail(f"--tokenizer={console(name)!r} has no tokenizer transformers can load ({console(str(err).splitlines()[0])[:200]}): {advice}")


def _view(path: Path, tokenizer: str, out: Path | None, limits: Limits) -> int:
    from opd.records.viewer import write_viewer

    _readable(path)
    html = out or path.with_name(path.name.removesuffix(".gz").removesuffix(".jsonl") + ".html")
    if not html.parent.is_dir():
        fail(f"--out={console(str(html))}: no such directory {console(str(html.parent))}")
    loaded = load_tokenizer(tokenizer)
    try:
        write_viewer(path, loaded, html, limits, follow=True)
    except (ValueError, OSError) as err:
        said = console(str(err))
        fail(said if console(str(path)) in said else f"{console(str(path))}: {said}", 1)
    return 0


def _export(source: Path, fmt: str, out: Path, model: str | None, limits: Limits) -> int:
    from opd.records.export import ExportError, export_file, groups_file, log_skips, run_model

    try:
        path = groups_file(source)
        done = export_file(path, out, fmt, model if model is not None else run_model(path), limits, follow=True)
    except (ExportError, OSError) as err:
        said = console(str(err))
        logger.error("%s", said if console(str(source)) in said else f"{console(str(source))}: {said}")
        return 1
    log_skips(path, done.skipped)
    logger.info("%s: %d rollouts of %d groups written to %s%s", console(str(path)), done.rows, done.groups, console(str(done.path)),
                f"; {len(done.skipped)} lines skipped" if done.skipped else "")
    return 1 if done.skipped else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m opd.records", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    limits = argparse.ArgumentParser(add_help=False)
    limits.add_argument("--max-line-mb", type=float, default=LIMITS.max_line_bytes / 2**20, help="the longest line read, in MiB (default %(default)g)")
    limits.add_argument("--max-ratio", type=float, default=LIMITS.max_ratio,
                        help="the most a gzip file may inflate, per 16 MiB inflated (default %(default)g; records inflate 15-25 times)")
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="check every group of record files", parents=[limits])
    check.add_argument("files", nargs="+", type=Path)
    check.add_argument("--rerender", action="store_true",
                       help="also render each rollout's conversation with the model's chat template and report where the ids differ")
    check.add_argument("--config", type=Path, help="the run's config.yaml (default: the one beside each FILE)")
    check.add_argument("--tokenizer", type=Path, help="the model's tokenizer directory (default: the config's server.model)")
    view = commands.add_parser("view", help="write the HTML viewer of a record file", parents=[limits])
    view.add_argument("file", type=Path, help="groups.jsonl or groups.jsonl.gz")
    view.add_argument("--tokenizer", default=str(FIXTURE_MODEL),
                      help="a tokenizer directory or a hub model in the local cache (default: the fixture model's)")
    view.add_argument("--out", type=Path, help="the page to write (default: FILE with the suffix .html)")
    export = commands.add_parser("export", help="one row per rollout, typed columns, as Parquet or JSON lines", parents=[limits])
    export.add_argument("source", type=Path, help="groups.jsonl(.gz), or a run directory")
    export.add_argument("--format", choices=("parquet", "jsonl"), default="parquet", help="the file written (default: %(default)s)")
    export.add_argument("--out", type=Path, required=True, help="the directory to write DIR/groups.<format> in (made if missing)")
    export.add_argument("--model", help="the model column (default: server.model of the run's config.yaml beside the file)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    chosen = dataclasses.replace(LIMITS, max_line_bytes=int(args.max_line_mb * 2**20), max_ratio=args.max_ratio)
    if args.command == "view":
        return _view(args.file, args.tokenizer, args.out, chosen)
    if args.command == "export":
        return _export(args.source, args.format, args.out, args.model, chosen)
    return _check(args.files, chosen, args.rerender, args.config, args.tokenizer)


if __name__ == "__main__":
    sys.exit(main())
