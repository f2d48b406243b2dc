"""The test tiers under pytest-xdist: a server tier's tests share one worker (so a run starts one
vLLM server, one Ray cluster, one Slurm cluster), whatever the other tests do."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from conftest import ROOT

# Tests that write which xdist worker ran them; the server-tier ones are marked as conftest's
# tiers are, the plain ones are in no group.
GROUPED_RUN = '''
import os
import time

import pytest


def _note(name: str) -> None:
    with open(os.environ["OPD_TIERS_NOTES"], "a") as notes:
        notes.write(f"{name} {os.environ.get('PYTEST_XDIST_WORKER', 'none')}\\n")


@pytest.mark.vllm
@pytest.mark.parametrize("i", range(6))
def test_server(i):
    time.sleep(0.2)
    _note("vllm")


@pytest.mark.ray
@pytest.mark.parametrize("i", range(6))
def test_cluster(i):
    time.sleep(0.2)
    _note("ray")


@pytest.mark.parametrize("i", range(6))
def test_plain(i):
    time.sleep(0.2)
    _note("plain")
'''


@pytest.mark.slow
def test_under_xdist_each_server_tier_runs_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(GROUPED_RUN)
    markers = "\n".join(f"    {tier}: x" for tier in ("fast", "vllm", "ray", "slurm", "browser", "slow"))
    (tmp_path / "pytest.ini").write_text(f"[pytest]\nmarkers =\n{markers}\n")
    notes = tmp_path / "notes.txt"
    run = subprocess.run(
        # This project's conftest as a plugin, with the project's own xdist options.
        [sys.executable, "-m", "pytest", "-p", "conftest", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider", "-q", str(tmp_path)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT / "tests"), "OPD_TIERS_NOTES": str(notes)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    workers: dict[str, list[str]] = defaultdict(list)
    for line in notes.read_text().splitlines():
        tier, worker = line.split()
        workers[tier].append(worker)
    assert {tier: len(ran) for tier, ran in workers.items()} == {"vllm": 6, "ray": 6, "plain": 6}
    assert all(worker.startswith("gw") for ran in workers.values() for worker in ran), workers
    assert len(set(workers["vllm"])) == 1 and len(set(workers["ray"])) == 1, dict(workers)
