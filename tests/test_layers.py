"""Imports run one way: a module imports only from its own package or from lower layers."""

from __future__ import annotations

import ast

import pytest

from conftest import ROOT

# Lowest first. A module's layer is that of the longest prefix listed here.
LAYERS = [
    ["opd.config", "opd.cli", "opd.event_loop", "opd.latency", "opd.run_files"],
    ["opd.records", "opd.tracking.traces", "opd.tracking.store"],
    ["opd.serving", "opd.data", "opd.train"],
    ["opd.jail"],
    ["opd.tools"],
    ["opd.rewards", "opd.agent"],
    ["opd.distill"],
    ["opd.envs"],
    ["opd.tracking.session", "opd.tracking.mlflow_run"],
    ["opd.sinks"],
    ["opd.runner"],
    ["opd.sweep.state", "opd.sweep.progress", "opd.fixture"],
    ["opd.build"],
    ["opd.distributed"],
    # `python -m opd.records` is an entry point: its --rerender needs the environments' tools.
    ["opd.experiment", "opd.atropos", "opd.records.__main__"],
    ["opd.sweep.callback"],
    ["experiments"],
]


def layer_of(module: str) -> tuple[int, str] | None:
    best = None
    for index, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and (best is None or len(name) > len(best[1])):
                best = (index, name)
    return best


def imports_of(path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):  # lazy imports inside functions count too
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.split(".")[0] in ("opd", "experiments")}


SOURCES = sorted(p for folder in ("opd", "experiments") for p in (ROOT / folder).rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(ROOT)) for p in SOURCES])
def test_imports_run_down_the_layers(path) -> None:
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    own = layer_of(module)
    if own is None:  # a package whose modules sit in different layers: its __init__ imports nothing
        assert not imports_of(path), f"{module} has no layer in tests/test_layers.py"
        return
    upward = []
    for name in imports_of(path):
        theirs = layer_of(name)
        if theirs is not None and theirs[0] > own[0]:
            upward.append(f"{name} (layer {theirs[0]} > {own[0]})")
    assert not upward, f"{module} imports from higher layers: {upward}"
