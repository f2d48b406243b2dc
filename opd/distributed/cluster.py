"""The Ray cluster of a run with `runner.workers` > 1: joined, or started here and stopped.

- `runner.ray.address`, else `$RAY_ADDRESS`: join that cluster (the same command then spreads a
  run over its nodes). Its nodes need this project installed at the same path (the workers import
  it and read the model's tokenizer from `server.model`) and must reach the inference servers.
- Neither: a local cluster for this run only (never one that happens to run on the machine):
  `runner.ray.num_cpus` CPUs, a `runner.ray.object_store_mb` object store, no dashboard UI, its
  session in a short private temporary directory (unix socket paths are limited to ~107 bytes),
  removed at the end. Its processes die with this one, also on SIGKILL (Ray's fate sharing).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import tempfile
import time
from typing import Any, Iterator

from opd.config import RayConfig

logger = logging.getLogger(__name__)


def cluster_address(cfg: RayConfig) -> str | None:
    """The cluster to join, or None for a local one."""
    return cfg.address or os.environ.get("RAY_ADDRESS") or None


@contextlib.contextmanager
def ray_cluster(cfg: RayConfig, workers: int) -> Iterator[Any]:
    """Yield the `ray` module connected to the run's cluster; disconnect (and stop a local
    cluster) at the end, also on errors."""
    import ray

    address = cluster_address(cfg)
    started = time.monotonic()
    temp_dir = None
    if address is not None:
        logger.info("joining the Ray cluster at %s", address)
        ray.init(address=address, configure_logging=False, log_to_driver=True)
    else:
        num_cpus = cfg.num_cpus or max(1, math.ceil(workers * cfg.cpus_per_worker))
        temp_dir = tempfile.mkdtemp(prefix="opd-ray-")
        # address="local": a new cluster, even where RAY_ADDRESS is unset but `ray start` runs here.
        ray.init(address="local", num_cpus=num_cpus, num_gpus=0, include_dashboard=False, object_store_memory=cfg.object_store_mb * 2**20,
                 _temp_dir=temp_dir, configure_logging=False, log_to_driver=True)
        logger.info("started a local Ray cluster (%d CPUs, %d MiB object store) in %.1f s", num_cpus, cfg.object_store_mb, time.monotonic() - started)
    try:
        yield ray
    finally:
        ray.shutdown()
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)
