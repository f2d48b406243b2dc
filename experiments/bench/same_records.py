"""Same records before and after a change: `python -m experiments.bench.same_records --rev REV`.

Runs the launcher of another checkout (`--rev`: a git revision, exported with `git archive`; or
`--root DIR`: a checkout) and of this working tree on one scripted server (this tree's
opd/serving/scripted_server.py, so only the framework differs), same seed, same overrides, for each
`--env`, and diffs their groups.jsonl field by field. Groups are matched by
`group_overrides.item_id` (they are written as they finish, so file order may differ), rollouts by
position. Exits 1 on any difference not declared below (RUN_SPECIFIC: always ignored; ADDED: a field
the other side does not have yet; REMOVED: a field this side no longer writes), 2 when it could not compare (a bad revision, a failed run), 0
otherwise; one JSON line per env on stdout.

Both sides run with this interpreter: the other checkout's code is imported from its own tree
(checked), its dependencies are this venv's (a warning says so when its locks/cpu.txt differs).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

from experiments.bench.common import FIXTURE, ROOT, scripted_server

logger = logging.getLogger("experiments.bench.same_records")

# Record fields whose value belongs to one run, not to its behaviour: path (`[]` = any position) -> why.
RUN_SPECIFIC: dict[str, str] = {
    "group_overrides.opd_wall_s": "seconds the group's OPD stage (votes, hints, teacher scoring) took: wall-clock time",
}

# Fields a change removed on purpose: ignored where only the other (older) side has them.
REMOVED: dict[str, str] = {
    "overrides[].correct": "issue 37: inline_math's `correct` said what `passed` says; `passed`, the rubric's verdict, is recorded once",
}

# Fields a change added on purpose: ignored where the other (older) side lacks them, compared where both have them.
ADDED: dict[str, str] = {
    "group_overrides.env": "96117be (issue 23): which environment wrote the group, for the viewer",
    "overrides[].passed": "96117be (issue 23): whether the rollout passed, for the viewer",
    "overrides[].tool_calls": "96117be (issue 23): calls that reached a tool, for the viewer",
}


@dataclasses.dataclass(frozen=True)
class Difference:
    item: str  # the group's item_id (with "#n" for an item's n-th repeat)
    path: str  # in the group, e.g. "tokens[2][17]"
    # changed; added (only this tree has it); removed (only the other side has it); length (of a
    # list); groups (the item's count of groups)
    kind: str
    other: Any
    this: Any

    @property
    def field(self) -> str:
        """The path with every position as `[]`: the key of RUN_SPECIFIC and ADDED."""
        return re.sub(r"\[\d+\]", "[]", self.path)

    @property
    def expected(self) -> bool:
        return self.field in RUN_SPECIFIC or (self.kind == "added" and self.field in ADDED) or (self.kind == "removed" and self.field in REMOVED)


def differences(other: Any, this: Any, item: str, path: str = "") -> Iterator[Difference]:
    """Every leaf where `this` differs from `other` (NaN equals NaN); equal subtrees cost one ==."""
    if other == this:
        return
    if isinstance(other, dict) and isinstance(this, dict):
        for key in [*other, *(k for k in this if k not in other)]:
            at = f"{path}.{key}" if path else str(key)
            if key not in this:
                yield Difference(item, at, "removed", other[key], None)
            elif key not in other:
                yield Difference(item, at, "added", None, this[key])
            else:
                yield from differences(other[key], this[key], item, at)
    elif isinstance(other, list) and isinstance(this, list):
        if len(other) != len(this):
            yield Difference(item, path, "length", len(other), len(this))
        for i, (a, b) in enumerate(zip(other, this)):
            yield from differences(a, b, item, f"{path}[{i}]")
    elif not (isinstance(other, float) and isinstance(this, float) and math.isnan(other) and math.isnan(this)):
        yield Difference(item, path, "changed", other, this)


def groups_by_item(path: Path) -> dict[str, list[dict[str, Any]]]:
    """A groups.jsonl's groups by item id, each item's groups in a canonical order (an item drawn
    twice may finish in either order): by tokens and scores, which no run-specific field changes."""
    groups: dict[str, list[dict[str, Any]]] = {}
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            group = json.loads(line)
            item = (group.get("group_overrides") or {}).get("item_id")
            if item is None:
                raise ValueError(f"{path}:{number}: a group without group_overrides.item_id cannot be matched to the other run's")
            groups.setdefault(str(item), []).append(group)
    return {item: sorted(found, key=lambda g: json.dumps([g.get("tokens"), g.get("scores")])) for item, found in groups.items()}


def compare_groups(other: dict[str, list[dict[str, Any]]], this: dict[str, list[dict[str, Any]]]) -> list[Difference]:
    """Every difference between two runs' groups (`groups_by_item`), a missing item included."""
    found: list[Difference] = []
    for item in sorted(set(other) | set(this)):
        a, b = other.get(item, []), this.get(item, [])
        if len(a) != len(b):
            found.append(Difference(item, "groups", "groups", len(a), len(b)))
        for i, (x, y) in enumerate(zip(a, b)):
            found.extend(differences(x, y, item if i == 0 else f"{item}#{i}"))
    return found


def summary(env: str, other: dict[str, list[dict[str, Any]]], this: dict[str, list[dict[str, Any]]], found: list[Difference]) -> dict[str, Any]:
    """One env's result: groups and rollouts compared, the expected differences counted by field
    (with why) and the unexpected ones (first 20)."""
    expected = Counter(d.field for d in found if d.expected)
    unexpected = [d for d in found if not d.expected]
    return {
        "env": env, "groups": [sum(map(len, other.values())), sum(map(len, this.values()))],
        "rollouts": sum(len(g.get("tokens") or []) for gs in this.values() for g in gs), "identical": not unexpected,
        "expected": {field: {"count": n, "why": RUN_SPECIFIC.get(field) or ADDED.get(field) or REMOVED[field]} for field, n in sorted(expected.items())},
        "unexpected_fields": sorted({d.field for d in unexpected}),
        "unexpected": [{"item": d.item, "path": d.path, "kind": d.kind, "other": repr(d.other)[:200], "this": repr(d.this)[:200]} for d in unexpected[:20]],
    }


def launch(checkout: Path, env: str, url: str, out: Path, seed: int, groups: int, overrides: list[str]) -> Path:
    """`python -m experiments.launch` of `checkout` against `url`; its groups.jsonl."""
    command = [sys.executable, "-m", "experiments.launch", f"env={env}", "server=vllm", f"server.model={FIXTURE}", f"server.base_urls=[{url}]",
               "tracking.enabled=false", "runner.progress=false", f"seed={seed}", f"total_steps={groups}", f"hydra.run.dir={out}",
               *(o.replace("{url}", url) for o in overrides)]
    environ = {**os.environ, "PYTHONPATH": str(checkout), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    done = subprocess.run(command, cwd=checkout, env=environ, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the launcher of {checkout} failed for env={env} (exit {done.returncode}): {done.stderr[-2000:]}")
    return out / "groups.jsonl"


def imports_from(checkout: Path) -> None:
    """Fail unless `python -m` in `checkout` imports that checkout's opd (not this venv's editable one)."""
    done = subprocess.run([sys.executable, "-c", "import opd; print(opd.__file__)"], cwd=checkout, env={**os.environ, "PYTHONPATH": str(checkout)},
                          capture_output=True, text=True)
    if done.returncode != 0 or not Path(done.stdout.strip()).resolve().is_relative_to(checkout.resolve()):
        raise RuntimeError(f"python in {checkout} imports opd from {done.stdout.strip() or done.stderr[-500:]}, not from that checkout")
    if (checkout / "locks/cpu.txt").read_bytes() != (ROOT / "locks/cpu.txt").read_bytes():
        logger.warning("%s pins other packages (locks/cpu.txt differs): it runs with this venv's", checkout)


def export(rev: str, into: Path) -> Path:
    """`rev` of this repository as plain files in `into` (no worktree, the repository untouched)."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", "--format=tar", rev], cwd=ROOT, capture_output=True)
    if archive.returncode != 0:
        raise RuntimeError(f"--rev {rev}: git archive failed: {archive.stderr.decode(errors='replace').strip()}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.bench.same_records", description=__doc__.split("\n")[0])
    side = parser.add_mutually_exclusive_group(required=True)
    side.add_argument("--rev", help="the git revision to compare this working tree with, e.g. eb0223d")
    side.add_argument("--root", type=Path, help="a checkout to compare this working tree with")
    parser.add_argument("--env", action="append", help="environments to run (repeatable; default inline_math and opd_coding)")
    parser.add_argument("--groups", type=int, default=4, help="groups per run (total_steps)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a Hydra override for both sides' runs ({url}: the scripted server's /v1 URL, e.g. judge.base_url={url})")
    parser.add_argument("--keep", type=Path, help="write both runs here (default: a temporary directory, removed)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        return 0 if compare_checkouts(args) else 1
    except RuntimeError as err:  # nothing was compared: a bad revision, a launcher that failed
        logger.error("%s", err)
        return 2


def compare_checkouts(args: argparse.Namespace) -> bool:
    """Run both checkouts per env and write each env's result line; whether every env was identical."""
    identical = True
    with tempfile.TemporaryDirectory(prefix="same-records-") as tmp:
        work = args.keep or Path(tmp)
        other_root = args.root.resolve() if args.root else export(args.rev, Path(tmp) / "other")
        imports_from(other_root)
        with scripted_server(0.0) as url:
            for env in args.env or ["inline_math", "opd_coding"]:
                runs = {name: groups_by_item(launch(root, env, url, work / f"{name}-{env}", args.seed, args.groups, args.set))
                        for name, root in (("other", other_root), ("this", ROOT))}
                result = summary(env, runs["other"], runs["this"], compare_groups(runs["other"], runs["this"]))
                for row in result["unexpected"]:
                    logger.error("%s, item %s: %s %s: %s -> %s", env, row["item"], row["kind"], row["path"], row["other"], row["this"])
                sys.stdout.write(json.dumps({"other": args.rev or str(other_root), **result}) + "\n")
                identical &= result["identical"]
    return identical


if __name__ == "__main__":
    raise SystemExit(main())
