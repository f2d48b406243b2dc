"""A sweep's shared state: the small JSON file in the sweep directory that its jobs read.

The launching process (`opd.sweep.callback`) writes it at the start of a sweep: the MLflow parent
run and, when one server is shared (the policy's, teacher=model's), its URLs and the settings it
was started with. Jobs read the
file, not the launcher's memory, so the wiring holds for jobs in other processes (joblib) or on
other machines that share the directory (submitit).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

from opd.run_files import read_text, replace_file

logger = logging.getLogger(__name__)

STATE_FILE = "opd_sweep.json"
# Server settings a job must share with the sweep's server to use it (max_logprobs may be lower).
_SERVER_KEYS = ("model", "dtype", "max_model_len", "tool_call_parser", "reasoning_parser", "chat_template", "cpu_kv_cache_gib", "enforce_eager", "extra_args", "environment")


@dataclass
class SweepState:
    """What the jobs of a sweep need from the launching process; stored as JSON in the sweep dir."""

    sweep_dir: str
    # Override keys the sweep varies (command-line sweeps and hydra.sweeper.params).
    swept: list[str]
    # MLflow parent run (None when tracking is off).
    parent_run_id: Optional[str] = None
    tracking_uri: Optional[str] = None
    experiment_id: Optional[str] = None
    # The shared server's /v1 URLs and the settings it was started with (None: each job starts its own).
    server_urls: Optional[list[str]] = None
    server_settings: dict[str, Any] = field(default_factory=dict)
    # teacher=model's shared server (its weights never change, so jobs that train may share it):
    # its /v1 URLs and settings (None: each job starts its own).
    teacher_urls: Optional[list[str]] = None
    teacher_settings: dict[str, Any] = field(default_factory=dict)
    # Jobs in the sweep (None: the sweeper does not say), when it started (epoch seconds), and
    # whether jobs run at once here (then the launcher shows one progress display for all).
    jobs: Optional[int] = None
    started: Optional[float] = None
    parallel: bool = False


def write_state(state: SweepState) -> Path:
    """The sweep's state file, replaced whole (`opd.run_files`: a link or a FIFO there is refused)."""
    path = Path(state.sweep_dir) / STATE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    return replace_file(path, json.dumps(asdict(state), indent=2))


def read_state(sweep_dir: str | Path) -> SweepState | None:
    path = Path(sweep_dir) / STATE_FILE
    if not os.path.lexists(path):
        return None
    return SweepState(**json.loads(read_text(path)))


def swept_keys(task_overrides: list[str], sweeper_params: dict[str, Any] | None) -> list[str]:
    """Keys a sweep varies: `a=1,2` / `a=range(..)` on the command line, plus the sweeper's params."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(task_overrides))
    keys = [o.key_or_group for o in parsed if o.is_sweep_override()]
    keys += [str(k) for k in (sweeper_params or {}) if str(k) not in keys]
    return keys


def count_jobs(task_overrides: list[str], sweeper: str, params: dict[str, Any] | None, n_trials: int | None) -> int | None:
    """How many jobs a sweep runs: the grid of the basic sweeper (command-line sweeps and its
    `params`), Optuna's `n_trials`; None for a sweeper (its `_target_`) that does not say."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if "optuna" in sweeper.lower():
        return n_trials
    if not sweeper.endswith("BasicSweeper"):
        return None
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    overrides = list(task_overrides) + [f"{k}={v}" for k, v in (params or {}).items()]
    batches = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(overrides), None)
    return sum(len(batch) for batch in batches)


def job_label(job_overrides: list[str], swept: list[str]) -> dict[str, str]:
    """{key: value} of a job's overrides for the swept keys (key as given on the command line)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    values: dict[str, str] = {}
    for override in OverridesParser.create().parse_overrides(list(job_overrides)):
        if override.key_or_group in swept:
            values[override.key_or_group] = override.get_value_element_as_str()
    return values


def run_name(values: dict[str, str]) -> str:
    """`correctness=0.7,efficiency=0.1`: last key component, or the full key where two collide."""
    short = [key.rsplit(".", 1)[-1].rsplit("/", 1)[-1] for key in values]
    names = [s if short.count(s) == 1 else key for s, key in zip(short, values)]
    return ",".join(f"{name}={_short_value(value)}" for name, value in zip(names, values.values())) or "job"


def _short_value(value: str) -> str:
    """Optuna's 0.6841694527491273 -> 0.6842 in names (the param keeps every digit)."""
    if "." in value and len(value) > 6:
        try:
            return f"{float(value):.4g}"
        except ValueError:
            pass
    return value


def server_settings(server: Any) -> dict[str, Any]:
    return {key: (list(value) if isinstance(value, (list, tuple)) else value) for key, value in ((k, getattr(server, k)) for k in _SERVER_KEYS)}


def shared_server_for(state: SweepState | None, server: Any) -> list[str] | None:
    """The sweep's server URLs if this job's server=local settings match them, else None."""
    if state is None or not state.server_urls:
        return None
    mine = server_settings(server)
    theirs = {k: v for k, v in state.server_settings.items() if k != "max_logprobs"}
    if mine != theirs or server.max_logprobs > state.server_settings.get("max_logprobs", 0):
        logger.warning("this job's server settings differ from the sweep's shared server; starting its own (%s vs %s)", mine, state.server_settings)
        return None
    return list(state.server_urls)


def teacher_server_settings(cfg: Any, teacher: str) -> dict[str, Any]:
    """What a job's local teacher server would be started with (the shared one must match it)."""
    t = cfg.teacher.server
    return {"model": teacher, "dtype": t.dtype, "max_model_len": t.max_model_len, "topk": cfg.teacher.topk,
            "cpu_kv_cache_gib": t.cpu_kv_cache_gib, "extra_args": list(t.extra_args), "max_concurrent": cfg.teacher.max_concurrent}


def shared_teacher_for(state: SweepState | None, cfg: Any, teacher: str) -> list[str] | None:
    """The sweep's teacher server URLs if this job's teacher settings match them, else None."""
    if state is None or not state.teacher_urls:
        return None
    mine = teacher_server_settings(cfg, teacher)
    if mine != state.teacher_settings:
        logger.warning("this job's teacher settings differ from the sweep's shared teacher server; starting its own (%s vs %s)", mine, state.teacher_settings)
        return None
    return list(state.teacher_urls)


@dataclass(frozen=True)
class SweepJob:
    """This process's place in a sweep: the sweep's state, the values this job sweeps and its
    number in the sweep (from 0)."""

    state: SweepState
    swept: dict[str, str]
    num: int = 0

    def tags(self) -> dict[str, str]:
        """The job run's sweep tags: the sweep dir, the swept keys, and the scheduler's job (Slurm)."""
        return {"opd.sweep_dir": self.state.sweep_dir, "opd.swept": ",".join(self.swept), **scheduler_tags(os.environ)}


def scheduler_tags(environ: Mapping[str, str]) -> dict[str, str]:
    """`slurm.job_id` (`<array job>_<task>` for the array tasks hydra/launcher=slurm submits: the
    id `squeue`, `sacct` and the `.submitit/<id>` log folder use) and `slurm.node` inside a Slurm
    job; nothing elsewhere."""
    if "SLURM_JOB_ID" not in environ:
        return {}
    array, task = environ.get("SLURM_ARRAY_JOB_ID"), environ.get("SLURM_ARRAY_TASK_ID")
    job_id = f"{array}_{task}" if array and task else environ["SLURM_JOB_ID"]
    return {"slurm.job_id": job_id, "slurm.node": environ.get("SLURMD_NODENAME", "")}


def current_job() -> SweepJob | None:
    """This job's place in the running sweep; None for a single run."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    hydra_cfg = HydraConfig.get()
    state = read_state(hydra_cfg.sweep.dir)
    if state is None:
        # Hydra only warns when a callback raises; a sweep job must not run on unlogged.
        raise RuntimeError(
            f"sweep job without sweep state in {hydra_cfg.sweep.dir}: the sweep callback "
            "(opd.sweep.callback.SweepCallback, hydra.callbacks.sweep) did not run or failed; see its warning above"
        )
    return SweepJob(state, job_label(list(hydra_cfg.overrides.task), state.swept), int(hydra_cfg.job.num))
