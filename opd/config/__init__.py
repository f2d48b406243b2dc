"""The typed configuration schema, one module per config group, registered in Hydra's ConfigStore.

`checks` declares ranges and walks the typed tree; `load` composes and validates; `root` holds the
root schema and the table of every group's schemas (where a new group is added). Every name the
project imports is here: `from opd.config import LocalTrainerConfig, validate`.
"""

from opd.config.checks import ConfigError
from opd.config.dataset import DatasetConfig
from opd.config.env import EnvConfig, InlineMathEnvConfig, OPDCodingEnvConfig, OPDConfig
from opd.config.evaluation import EvalConfig
from opd.config.judge import JudgeConfig, JudgeServerConfig
from opd.config.load import CONF_DIR, PROJECT_ROOT, compose, load_object, project_path, register, run_dir, validate
from opd.config.model import ModelCoding, ModelConfig, ModelInlineMath, ModelSampling
from opd.config.reward import (CodingWeights, CorrectnessLevels, Efficiency, InlineMathRewardConfig, InlineMathWeights,
                               OPDCodingRewardConfig, ToolUsage)
from opd.config.root import SCHEMAS, Config
from opd.config.runner import RayConfig, RunnerConfig
from opd.config.sandbox import SandboxConfig
from opd.config.serve import ServeConfig
from opd.config.server import LocalServerConfig, RemoteServerConfig, ServerConfig
from opd.config.sweep import SweepConfig
from opd.config.teacher import ModelTeacherConfig, TeacherConfig, TeacherServerConfig
from opd.config.tracking import TrackingConfig
from opd.config.trainer import LocalTrainerConfig, RefreshCheckConfig, TrainerConfig

__all__ = [
    "CONF_DIR", "PROJECT_ROOT", "SCHEMAS", "CodingWeights", "Config", "ConfigError", "CorrectnessLevels", "DatasetConfig", "Efficiency",
    "EnvConfig", "EvalConfig", "InlineMathEnvConfig", "InlineMathRewardConfig", "InlineMathWeights", "JudgeConfig", "JudgeServerConfig",
    "LocalServerConfig", "LocalTrainerConfig", "ModelCoding", "ModelConfig", "ModelInlineMath", "ModelSampling", "ModelTeacherConfig", "OPDCodingEnvConfig",
    "OPDCodingRewardConfig", "OPDConfig", "RayConfig", "RefreshCheckConfig", "RemoteServerConfig", "RunnerConfig", "SandboxConfig",
    "ServeConfig", "ServerConfig", "SweepConfig", "TeacherConfig", "TeacherServerConfig", "ToolUsage", "TrackingConfig", "TrainerConfig", "compose", "load_object", "project_path",
    "register", "run_dir", "validate",
]
