"""`python -m opd.records check FILE [FILE ...]`: check every group of record files (exit 1 on any
problem); with `--rerender`, also render each rollout's conversation with the chat template of the
model that wrote it and report where the ids differ (`opd.envs.rerender`);
`python -m opd.records view FILE [--tokenizer DIR] [--out HTML]`: write its viewer."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from opd.records.io import read_groups
from opd.records.rules import check_group

logger = logging.getLogger("opd.records")
# The fixture model's directory (opd/fixture/model), named by path: opd.fixture is a higher layer.
FIXTURE_MODEL = Path(__file__).resolve().parents[1] / "fixture" / "model"


def check_file(path: Path) -> tuple[int, list[str]]:
    """(groups read, problems as `group N: ...` strings)."""
    problems: list[str] = []
    count = 0
    try:
        for count, group in enumerate(read_groups(path), 1):
            problems += [f"group {count}: {p}" for p in check_group(group)]
    except (ValueError, OSError) as err:
        problems.append(str(err))
    return count, problems


def _check(paths: list[Path], rerender: bool = False, config: Path | None = None, tokenizer: Path | None = None) -> int:
    failed = False
    for path in paths:
        count, problems = check_file(path)
        for problem in problems:
            logger.error("%s: %s", path, problem)
        logger.info("%s: %d groups, %d problems", path, count, len(problems))
        failed |= bool(problems) or count == 0
        if rerender and count and not problems:  # a file that breaks the format's rules is not re-rendered
            failed |= _rerender(path, config or path.parent / "config.yaml", tokenizer) != 0
    return 1 if failed else 0


def rerender_file(path: Path, config: Path, tokenizer: Path | None = None) -> tuple[list[str], list[str]]:
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
        for number, group in enumerate(read_groups(path), 1):
            for index, difference in rerender_group(group, renderer):
                where = f"group {number}" + (f" rollout {index}" if index >= 0 else "")
                (errors if difference.error else notes).append(f"{where}: {difference.describe(renderer.tokenizer)}")
    except (ValueError, OSError) as err:
        errors.append(str(err))
    return errors, notes


# Notes shown per file (the rest are counted): a family whose template re-renders every sampled
# turn otherwise has some in every rollout.
MAX_NOTES_SHOWN = 10


def _rerender(path: Path, config: Path, tokenizer: Path | None) -> int:
    errors, notes = rerender_file(path, config, tokenizer)
    for error in errors:
        logger.error("%s: %s", path, error)
    for note in notes[:MAX_NOTES_SHOWN]:
        logger.info("%s: %s", path, note)
    if len(notes) > MAX_NOTES_SHOWN:
        logger.info("%s: ... and %d more places in sampled turns the template renders otherwise", path, len(notes) - MAX_NOTES_SHOWN)
    logger.info("%s: re-rendered with the chat template of the run of %s: %d differences from it in prompts or inserted text, "
                "%d places in sampled turns it renders otherwise", path, config, len(errors), len(notes))
    return 1 if errors else 0


def _view(path: Path, tokenizer_dir: Path, out: Path | None) -> int:
    from transformers import AutoTokenizer

    from opd.records.viewer import write_viewer

    html = out or path.with_name(path.name.removesuffix(".gz").removesuffix(".jsonl") + ".html")
    try:
        write_viewer(path, AutoTokenizer.from_pretrained(str(tokenizer_dir)), html)
    except (ValueError, OSError) as err:
        logger.error("%s: %s", path, err)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m opd.records", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="check every group of record files")
    check.add_argument("files", nargs="+", type=Path)
    check.add_argument("--rerender", action="store_true",
                       help="also render each rollout's conversation with the model's chat template and report where the ids differ")
    check.add_argument("--config", type=Path, help="the run's config.yaml (default: the one beside each FILE)")
    check.add_argument("--tokenizer", type=Path, help="the model's tokenizer directory (default: the config's server.model)")
    view = commands.add_parser("view", help="write the HTML viewer of a record file")
    view.add_argument("file", type=Path, help="groups.jsonl or groups.jsonl.gz")
    view.add_argument("--tokenizer", type=Path, default=FIXTURE_MODEL, help="a tokenizer directory (default: the fixture model's)")
    view.add_argument("--out", type=Path, help="the page to write (default: FILE with the suffix .html)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.command == "view":
        return _view(args.file, args.tokenizer, args.out)
    return _check(args.files, args.rerender, args.config, args.tokenizer)


if __name__ == "__main__":
    sys.exit(main())
