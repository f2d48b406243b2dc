"""A pytest plugin (`-p collected_markers`, with tests/ on the path): writes each collected test's
marker names, as JSON {test id: [names]}, to the file $OPD_MARKERS_OUT. test_readme evaluates every
README test command's `-m` expression on one collection of the suite instead of collecting it once
per command (a collection is ~11 s of CPU)."""

from __future__ import annotations

import json
import os

import pytest


@pytest.hookimpl(trylast=True)  # after conftest has given each test its tier
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    with open(os.environ["OPD_MARKERS_OUT"], "w", encoding="utf-8") as out:
        json.dump({item.nodeid: sorted({mark.name for mark in item.iter_markers()}) for item in items}, out)
