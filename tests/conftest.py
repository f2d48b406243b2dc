"""Shared fixtures: the test tiers (`fast` unless marked heavy), the composed config tree, the fixture
model, one real vLLM server per session."""

from __future__ import annotations

import contextlib
import copy
import functools
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import pytest

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Under pytest-xdist the workers share the cores: one OpenMP thread for torch in each test process
# and in the runs and builds it starts (they inherit it; vLLM's CPU worker sets its own). Two
# threads per process on busy cores spin waiting on each other: test_opd_plain's arms took 175-314 s
# each at load 15, 3 s alone.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"

# The tiers beside `fast` (pyproject.toml registers them): a test in none of them is `fast`.
HEAVY_TIERS = ("vllm", "ray", "slurm", "browser", "slow")
# A test that takes one of these fixtures is in its tier whether or not it says so.
TIER_OF_FIXTURE = {"vllm_url": "vllm", "ray_address": "ray", "slurm": "slurm"}


def one_fast(values: list, fast: tuple = ()) -> list:
    """`values` as parameters, each but `fast` (default: the first) in the slow tier: the fast tier
    runs the logic once, the whole suite runs it for every value."""
    fast = fast or (values[0],)
    return [v if v in fast else pytest.param(v, marks=pytest.mark.slow) for v in values]


# Tiers whose tests share one server or cluster: under pytest-xdist (`-n`), each runs on one worker
# (`--dist loadgroup`), so a run starts one vLLM server, one Ray cluster and one Slurm cluster.
SERVER_TIERS = ("vllm", "ray", "slurm")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with the tier of the fixtures it needs, and `fast` when it is in no heavy tier;
    a test of a server tier joins that tier's xdist group (the first such tier it is in)."""
    for item in items:
        for fixture in TIER_OF_FIXTURE.keys() & set(getattr(item, "fixturenames", ())):
            item.add_marker(TIER_OF_FIXTURE[fixture])
        if not any(item.get_closest_marker(tier) for tier in HEAVY_TIERS):
            item.add_marker("fast")
        group = next((tier for tier in SERVER_TIERS if item.get_closest_marker(tier)), None)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    if getattr(config.option, "loadgroup", False):  # an xdist worker of a `--dist loadgroup` run
        for item in items:
            _join_xdist_group(item)


def _join_xdist_group(item: pytest.Item) -> None:
    """Suffix the item's id with its `xdist_group` names, as pytest-xdist 3.8 means to: it writes
    `item._nodeid`, which pytest 9.2 no longer reads (pytest-xdist#1386), so its groups were
    silently ignored. Once xdist writes the id itself, a second suffix names the same group."""
    names = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default")) for mark in item.iter_markers("xdist_group")})
    if not names or item.nodeid.endswith("@" + "_".join(names)):
        return
    from _pytest.nodeid import NodeId

    item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(names)}")


@pytest.fixture
def own_leases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, int]:
    """Uid leases (opd.jail.uids) in a directory of the test's own, and a uid range no other test
    leases from (this process's, below 2**31: bwrap cannot map a uid above), so that what the test
    finds in either is its own doing: (the directory, the range's base)."""
    from opd.jail import uids

    directory = tmp_path / "leases"
    directory.mkdir(mode=0o700)
    monkeypatch.setattr(uids, "_lock_dir", lambda: directory)
    return directory, 1_000_000_000 + (os.getpid() % 15_000) * uids.UID_COUNT


def compose(overrides: list[str] | None = None):
    """The real config tree composed like the launcher does: a copy of its own, composed once a
    session for the same overrides (Hydra takes ~0.2 s of CPU a compose). Its output_dir is a place
    nothing can be made in, so a test that writes under it fails instead of writing into a shared
    directory; such a test sets output_dir to its tmp_path."""
    return copy.deepcopy(_composed((f"output_dir={UNWRITABLE_DIR}", *(overrides or []))))


# Under /proc no directory can be made, by root either.
UNWRITABLE_DIR = "/proc/opd-tests-set-output_dir"


@functools.lru_cache(maxsize=None)
def _composed(overrides: tuple[str, ...]):
    from opd.config import compose as compose_config

    return compose_config(list(overrides))


def sandbox_limits(**changes):
    """The configured sandbox limits (conf/sandbox/default.yaml) with `changes`."""
    from dataclasses import replace

    return replace(_default_sandbox(), **changes)


@functools.lru_cache(maxsize=None)
def _default_sandbox():
    from opd.config import validate

    return validate(compose()).env.sandbox


@functools.lru_cache(maxsize=None)
def family_tokenizer(name: str):
    """The real tokenizer of preset `name` (opd.fixture.families; the fixture's own for "fixture"),
    loaded once per test process: a load takes ~0.6 s of CPU, and the template and control-token
    tests ask for the same seven hundreds of times. Shared, so a test only reads it."""
    from opd.serving.tokenizer import load_tokenizer

    return load_tokenizer(str(family_dir(name)))


def family_dir(name: str) -> Path:
    """The directory of preset `name`'s tokenizer and template (the fixture model's for "fixture")."""
    if name == "fixture":
        from opd.fixture.build import ensure_fixture

        return Path(ensure_fixture())
    from opd.fixture.families import tokenizer_dir

    return tokenizer_dir(name)


@pytest.fixture(scope="session")
def fixture_model() -> str:
    from opd.fixture.build import ensure_fixture

    override = os.environ.get("OPD_FIXTURE_DIR")
    return override or str(ensure_fixture())


@pytest.fixture(scope="session")
def tokenizer(fixture_model: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(fixture_model)


@pytest.fixture(scope="session")
def untied_fixture(fixture_model: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The fixture with its output layer as a tensor of its own (the same values), which the test
    servers load, as a closed loop's server does: an in-place reload then refreshes all of it."""
    from opd.train.untied import untied_copy

    return str(untied_copy(fixture_model, tmp_path_factory.mktemp("untied") / "fixture"))


def _vllm_server(fixture_model: str, weights: str, workdir: Path):
    """A real vLLM OpenAI server on the fixture model (top-20 logprobs), not yet started."""
    from dataclasses import replace

    from opd.serving.lifecycle import whole_prefill_args
    from opd.config import validate
    from opd.serving.local_vllm import LocalVLLM

    # Dev routes on: the closed-loop tests reload weights in place (and put the fixture's back).
    settings = validate(compose(["distill_topk=20", "server.startup_timeout_s=300", "+server.environment.VLLM_SERVER_DEV_MODE='1'"])).server
    # Tests evaluate with seeds, which vLLM's CPU build survives only with whole prefills.
    settings = replace(settings, extra_args=[*settings.extra_args, *whole_prefill_args(settings.extra_args, settings.max_model_len)])
    return LocalVLLM(settings, fixture_model, workdir, weights=weights)


@pytest.fixture(scope="session", autouse=True)
def _vllm_started_ahead(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Future | None]:
    """When the session has tests that need the vLLM server, it starts (in a thread) with the
    session's first test, so that its start-up overlaps the tests before the first of them; stopped
    at the session's end. None when no test needs it."""
    if not any("vllm_url" in getattr(item, "fixturenames", ()) for item in request.session.items):
        yield None
        return
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Every xdist worker collects every test but runs only its share: the worker that gets the
        # vllm group starts the server when its first test asks (the vllm_url fixture).
        yield None
        return
    server = _vllm_server(request.getfixturevalue("fixture_model"), request.getfixturevalue("untied_fixture"), tmp_path_factory.mktemp("vllm"))
    pool = ThreadPoolExecutor(max_workers=1)
    started = pool.submit(server.start)
    try:
        yield started
    finally:
        with contextlib.suppress(Exception):  # a failed start has stopped itself; the tests said so
            started.result()
        server.stop()
        pool.shutdown()


@pytest.fixture(scope="session")
def vllm_url(_vllm_started_ahead: Future | None, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real vLLM server, started once for the whole session (or, under xdist, for the worker that
    runs the vllm group)."""
    if _vllm_started_ahead is not None:
        yield _vllm_started_ahead.result()
        return
    server = _vllm_server(request.getfixturevalue("fixture_model"), request.getfixturevalue("untied_fixture"), tmp_path_factory.mktemp("vllm"))
    try:
        yield server.start()
    finally:
        server.stop()
