"""The root schema (conf/config.yaml) and the table of every group's schemas.

A new config group: its dataclasses in a module of this package named after the group
(`opd/config/<group>.py`, ranges declared with `checked(...)`), its field in `Config` below,
its schemas in `SCHEMAS`, and its names in `opd/config/__init__.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import MISSING

from opd.config.checks import ConfigError, at_least, checked, one_of, relation, require
from opd.config.dataset import DatasetConfig
from opd.config.env import InlineMathEnvConfig, OPDCodingEnvConfig
from opd.config.evaluation import EvalConfig
from opd.config.judge import JudgeConfig, JudgeServerConfig
from opd.config.model import ModelConfig
from opd.config.reward import InlineMathRewardConfig, OPDCodingRewardConfig
from opd.config.runner import RunnerConfig
from opd.config.sandbox import SandboxConfig
from opd.config.serve import ServeConfig
from opd.config.server import LocalServerConfig, RemoteServerConfig
from opd.config.sweep import SweepConfig
from opd.config.teacher import ModelTeacherConfig, TeacherConfig
from opd.config.tracking import TrackingConfig
from opd.config.trainer import LocalTrainerConfig, TrainerConfig


@dataclass
class Config:
    """The root (conf/config.yaml); the groups' schemas come from the chosen options."""

    model: ModelConfig = MISSING
    env: Any = MISSING
    dataset: DatasetConfig = MISSING
    reward: Any = MISSING
    server: Any = MISSING
    judge: Any = MISSING
    teacher: Any = MISSING
    tracking: TrackingConfig = MISSING
    runner: RunnerConfig = MISSING
    sweep: SweepConfig = MISSING
    serve: ServeConfig = MISSING
    trainer: Any = MISSING
    eval: EvalConfig = MISSING
    mode: str = checked(one_of("train", "evaluate", "serve"))
    group_size: int = checked(at_least(1))
    total_steps: int = checked(at_least(1))
    seed: int = MISSING
    distill_topk: int = checked(at_least(1))
    judge_votes: int = checked(at_least(1))
    output_root: str = MISSING
    output_dir: str = MISSING
    resume: bool = MISSING
    sinks: list[str] = MISSING
    # {sink name: its settings}. `sinks` and `sink_settings` are checked against what each sink
    # declares where it is registered (opd.sinks.registry.check_sinks, at preflight and at a
    # sweep's start): a higher layer than this schema.
    sink_settings: dict[str, Any] = MISSING


@relation(Config)
def logprobs_for_the_teacher_topk(cfg: Config, at: str) -> None:
    require(cfg.server.max_logprobs >= cfg.distill_topk, "server.max_logprobs", f">= distill_topk ({cfg.distill_topk})", cfg.server.max_logprobs)


@relation(Config)
def a_request_slot_per_worker(cfg: Config, at: str) -> None:
    # Each worker gets a share of every server's request slots; a worker without one would idle.
    if cfg.runner.workers > 1:
        require(cfg.server.max_requests_in_flight >= cfg.runner.workers, "runner.workers",
                f"<= server.max_requests_in_flight ({cfg.server.max_requests_in_flight}; each worker needs a request slot)", cfg.runner.workers)


@relation(Config)
def local_trainer_trains_in_the_run(cfg: Config, at: str) -> None:
    # Whether the weighted loss terms have a signal is checked at preflight (opd.train.teacher_terms).
    if cfg.trainer.kind == "local":
        require(cfg.mode == "train", "trainer", "used with mode=train (trainer=local trains on the groups it writes)", f"trainer={cfg.trainer.kind}, mode={cfg.mode}")


@relation(Config)
def a_teacher_the_env_can_use(cfg: Config, at: str) -> None:
    # Hints come only from an env that judges turn pairs (env.opd: opd_coding).
    opd = getattr(cfg.env, "opd", None)
    if cfg.teacher.kind == "self_hint":
        require(opd is not None, "teacher", "none or model with this env (teacher=self_hint needs the judge's hints: env=opd_coding)",
                f"teacher=self_hint, env={getattr(cfg.env, 'name', '?')}")
    if opd is not None and opd.enabled and cfg.teacher.kind == "none":
        raise ConfigError("env.opd.enabled: true judges turns for hints, but teacher=none takes none; choose teacher=self_hint, "
                          "teacher=model teacher.hint=true, or env.opd.enabled=false", "env.opd.enabled")
    if cfg.teacher.kind == "model":
        # Each environment worker gets a share of the teacher's scoring slots, as of the policy's.
        require(cfg.teacher.max_concurrent >= cfg.runner.workers, "runner.workers",
                f"<= teacher.max_concurrent ({cfg.teacher.max_concurrent}; each worker needs a teacher slot)", cfg.runner.workers)
        require(not cfg.teacher.hint or opd is not None, "teacher.hint", "false with this env (only opd_coding judges turns for hints)", cfg.teacher.hint)


# Every group's schemas by the option names conf/ selects them with (`defaults: [<name>]`).
SCHEMAS: dict[str | None, dict[str, type]] = {
    None: {"config_schema": Config},
    "model": {"model_schema": ModelConfig},
    "env": {"inline_math_schema": InlineMathEnvConfig, "opd_coding_schema": OPDCodingEnvConfig},
    "reward": {"inline_math_schema": InlineMathRewardConfig, "opd_coding_schema": OPDCodingRewardConfig},
    "server": {"local_schema": LocalServerConfig, "vllm_schema": RemoteServerConfig},
    "judge": {"policy_schema": JudgeConfig, "server_schema": JudgeServerConfig},
    "teacher": {"none_schema": TeacherConfig, "self_hint_schema": TeacherConfig, "model_schema": ModelTeacherConfig},
    "dataset": {"dataset_schema": DatasetConfig},
    "sandbox": {"sandbox_schema": SandboxConfig},
    "tracking": {"tracking_schema": TrackingConfig},
    "runner": {"runner_schema": RunnerConfig},
    "trainer": {"trainer_schema": TrainerConfig, "local_schema": LocalTrainerConfig},
}
