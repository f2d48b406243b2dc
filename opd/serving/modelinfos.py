"""vLLM's facts about model classes, kept between runs.

Before a server loads a model, vLLM inspects the model's class (whether it is multimodal, takes
pooling, ...) in a subprocess of its own: one more interpreter importing vLLM and torch, about
9 s of CPU of a start-up's 40 on this machine. It keeps the answer in
`$VLLM_CACHE_ROOT/modelinfos/<module>-<class>.json`, stamped with the hash of the class's module
source, and reads it back on the next start. A server the run starts has a cache folder of the
run's own (opd/serving/local_vllm.py), new every run, so each run paid the inspection again.

Here those files are copied from `$OPD_CACHE_DIR/vllm_modelinfos` (default
`~/.cache/opd/vllm_modelinfos`) into the run's cache before a start, and the server's new or changed
ones back once it is up. vLLM checks the stamp itself: a file from another vLLM version is stale to
it and the class is inspected again. A kept file that cannot be read, or a file that cannot be kept,
is passed over (the next start inspects the class).
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

from opd.run_files import RunFileError, make_dir, open_file, read_bytes
from opd.serving.tokenizer import cache_file

logger = logging.getLogger(__name__)

# Larger files are not vLLM's model infos (a few hundred bytes each).
MAX_BYTES = 1 << 16


def shared_dir() -> Path:
    """Where model infos are kept between runs."""
    return cache_file().parent / "vllm_modelinfos"


def _infos(directory: Path) -> dict[str, bytes]:
    """The model-info files of `directory` (name -> bytes); none where it is absent."""
    found: dict[str, bytes] = {}
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return found
    for name in names:
        if not name.endswith(".json") or name.startswith("."):
            continue
        try:
            found[name] = read_bytes(directory / name, MAX_BYTES)
        except (OSError, RunFileError):  # not a regular file of its own, too long, gone meanwhile
            continue
    return found


def seed(cache_root: Path) -> int:
    """Copy the kept model infos into a run's `cache_root`/modelinfos (made a directory of its own),
    leaving files already there; how many were copied."""
    target = make_dir(cache_root / "modelinfos")
    present = set(os.listdir(target))
    copied = 0
    for name, data in _infos(shared_dir()).items():
        if name in present:
            continue
        with open_file(target / name, "wb") as handle:
            handle.write(data)
        copied += 1
    return copied


def keep(cache_root: Path) -> int:
    """Copy a run's model infos that are new or changed to the shared directory (each replaced
    atomically); how many were copied."""
    kept, copied = _infos(shared_dir()), 0
    for name, data in _infos(cache_root / "modelinfos").items():
        if kept.get(name) == data:
            continue
        try:
            directory = shared_dir()
            directory.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("wb", dir=directory, prefix=".", suffix=".tmp", delete=False) as tmp:
                tmp.write(data)
            os.replace(tmp.name, directory / name)
            copied += 1
        except OSError as err:
            logger.warning("vLLM model info %s not kept in %s (the next run inspects the class again): %s", name, shared_dir(), err)
            return copied
    return copied
