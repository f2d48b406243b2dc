"""The trainer's schemas (conf/trainer/): none, an external Atropos trainer, or the local one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

from omegaconf import MISSING

from opd.config.checks import above, at_least, checked, each, join, one_of, relation, require, within


@dataclass
class TrainerConfig:
    """trainer=none | atropos (conf/trainer/): no trainer in the run, or an external one."""

    kind: str = checked(one_of("none", "local", "atropos"))


@relation(TrainerConfig)
def local_is_chosen_as_a_group(trainer: TrainerConfig, at: str) -> None:
    # trainer=local has settings of its own (conf/trainer/local.yaml): chosen as a group.
    if type(trainer) is TrainerConfig:
        require(trainer.kind != "local", join(at, "kind"), "none or atropos here; choose the local trainer with trainer=local", trainer.kind)


@dataclass
class RefreshCheckConfig:
    """trainer.refresh_check: the served weights checked against the trainer's after each refresh."""

    enabled: bool = MISSING
    tokens: int = checked(at_least(16))
    tolerance: float = checked(at_least(1.0))
    max_start: float = checked(above(0))
    dtype: str = checked(one_of("auto", "bfloat16", "float16", "half", "float32", "float"))


@dataclass
class LocalTrainerConfig(TrainerConfig):
    """trainer=local: the reference trainer in the run (conf/trainer/local.yaml)."""

    kind: str = checked(one_of("local"))
    batch_groups: int = checked(at_least(1))
    learning_rate: float = checked(above(0))
    weight_decay: float = checked(at_least(0))
    max_grad_norm: float = checked(above(0))
    clip: float = checked(within(0, 1, "()"))
    opd_clamp: Optional[float] = checked(above(0), null="unbounded")
    equal_score_groups: str = checked(one_of("drop", "keep"))
    loss: Dict[str, float] = checked(each(at_least(0)))
    micro_batch: int = checked(at_least(1))
    shared_prefix: bool = MISSING
    max_tokens: Optional[int] = checked(at_least(2), null="all")
    max_staleness: int = checked(at_least(0))
    refresh: bool = MISSING
    refresh_check: RefreshCheckConfig = MISSING
    threads: int = checked(at_least(0))
    seed: int = MISSING


@relation(LocalTrainerConfig)
def some_loss_weight(trainer: LocalTrainerConfig, at: str) -> None:
    require(sum(trainer.loss.values()) > 0, join(at, "loss"), "weights that are not all 0", dict(trainer.loss))
