"""Check every group of a groups.jsonl file: `python -m opd.validate FILE [FILE ...]`.

Exit status 0 when every group is valid, 1 otherwise; one log line per problem found.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from opd.records import check_group, read_groups

logger = logging.getLogger("opd.validate")


def validate_file(path: Path) -> tuple[int, list[str]]:
    """(groups read, problems as `line N: ...` strings)."""
    problems: list[str] = []
    count = 0
    try:
        for count, group in enumerate(read_groups(path), 1):
            problems += [f"group {count}: {p}" for p in check_group(group)]
    except (ValueError, OSError) as err:
        problems.append(str(err))
    return count, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    failed = False
    for path in args.files:
        count, problems = validate_file(path)
        for problem in problems:
            logger.error("%s: %s", path, problem)
        logger.info("%s: %d groups, %d problems", path, count, len(problems))
        failed |= bool(problems) or count == 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
