"""The tracking schema (conf/tracking/): the MLflow store, experiment and what a run logs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from omegaconf import MISSING

from opd.config.checks import at_least, checked, nonempty


@dataclass
class TrackingConfig:
    """MLflow (conf/tracking/mlflow.yaml)."""

    enabled: bool = MISSING
    uri: str = checked(nonempty("a non-empty MLflow URI"))
    artifact_root: Optional[str] = MISSING
    experiment: str = MISSING
    run_name: Optional[str] = MISSING
    max_param_chars: int = checked(at_least(16))
    log_data_artifacts: bool = MISSING
    log_input: bool = MISSING
    traces: bool = MISSING
    traces_max_rollouts: int = checked(at_least(0))
