"""Imports run one way: a module imports only from its own package or from lower layers.

Every import counts wherever it stands: at the top, inside a function or a method, under
`if TYPE_CHECKING:`, relative (`from ..x import y`) or absolute."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

from conftest import ROOT

# Lowest first. A module's layer is that of the longest prefix listed here.
LAYERS = [
    # opd.registry: named plug-ins, every registry (environments, sinks, loss terms, reward signals, record rules).
    ["opd.config", "opd.cli", "opd.event_loop", "opd.latency", "opd.run_files", "opd.registry"],
    ["opd.records", "opd.tracking.traces", "opd.tracking.store", "opd.tracking.ui"],
    ["opd.serving", "opd.data", "opd.train"],
    ["opd.jail"],
    # Records as a dataset: the rows carry the trainer's group-normalised advantage (opd.train.batch).
    ["opd.records.export"],
    ["opd.tools"],
    ["opd.rewards", "opd.agent"],
    ["opd.distill"],
    ["opd.envs"],
    ["opd.tracking.session", "opd.tracking.mlflow_run"],
    ["opd.sinks"],
    ["opd.runner"],
    ["opd.fixture"],
    ["opd.build"],
    ["opd.distributed"],
    # Sweeps: the state file and progress the jobs read.
    ["opd.sweep"],
    # The teacher, a component: each kind's preflight, server and rows (over the build, the servers' lifecycles and a sweep's shared teacher).
    ["opd.teachers"],
    # `python -m opd.records` is an entry point: its --rerender needs the environments' tools. The
    # sweep's callback (Hydra's entry into a sweep) starts the shared servers, the teacher's through its component.
    ["opd.experiment", "opd.atropos", "opd.records.__main__", "opd.sweep.callback"],
    ["experiments"],
]
FOLDERS = ("opd", "experiments")


def layer_of(module: str) -> tuple[int, str] | None:
    best = None
    for index, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and (best is None or len(name) > len(best[1])):
                best = (index, name)
    return best


def module_name(path: Path, root: Path) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")


def imports_of(path: Path, root: Path = ROOT) -> set[str]:
    """The project's modules (and names in them) that `path` imports, anywhere in it."""
    module = module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):  # every node: imports inside functions and classes too
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, `level - 1` packages up
                parts = package.split(".")
                anchor = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            if base:
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.split(".")[0] in FOLDERS}


def upward_imports(path: Path, root: Path = ROOT) -> list[str]:
    """The imports of `path` from higher layers, as `name (layer theirs > own)`."""
    module = module_name(path, root)
    own = layer_of(module)
    if own is None:  # a package whose modules sit in different layers: its __init__ imports nothing
        assert not imports_of(path, root), f"{module} has no layer in tests/test_layers.py"
        return []
    upward = []
    for name in sorted(imports_of(path, root)):
        theirs = layer_of(name)
        if theirs is not None and theirs[0] > own[0]:
            upward.append(f"{name} (layer {theirs[0]} > {own[0]})")
    return upward


SOURCES = sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(ROOT)) for p in SOURCES])
def test_imports_run_down_the_layers(path: Path) -> None:
    upward = upward_imports(path)
    assert not upward, f"{module_name(path, ROOT)} imports from higher layers: {upward}"


PLANTED = {
    "in a function": "def late():\n    from opd.experiment import run_experiment\n    return run_experiment\n",
    "in a method": "class Late:\n    def run(self):\n        import opd.experiment\n        return opd.experiment\n",
    "relative, in a function": "def late():\n    from ..sweep.callback import SweepCallback\n    return SweepCallback\n",
    "under TYPE_CHECKING": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from opd.runner import Runner\n",
}


@pytest.mark.parametrize("planted", PLANTED, ids=list(PLANTED))
def test_an_upward_import_planted_in_a_copy_is_caught(planted: str, tmp_path: Path) -> None:
    """A copy of a low module (opd/records/reader.py) passes; the same copy with an import of a
    higher layer added where a top-level scan would not see it fails, naming that import."""
    copy = tmp_path / "opd" / "records" / "reader.py"
    copy.parent.mkdir(parents=True)
    shutil.copyfile(ROOT / "opd" / "records" / "reader.py", copy)
    assert upward_imports(copy, tmp_path) == []
    copy.write_text(copy.read_text() + "\n\n" + PLANTED[planted])
    found = upward_imports(copy, tmp_path)
    assert len(found) >= 1 and all(" > 1)" in f for f in found), found
    assert any(f.startswith(("opd.experiment", "opd.sweep.callback", "opd.runner")) for f in found), found
