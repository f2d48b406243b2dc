"""The teacher's schemas (conf/teacher/): none, the policy given a hindsight hint, or a model of its own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from omegaconf import MISSING

from opd.config.checks import at_least, checked, join, nonempty, relation, require, url


@dataclass
class TeacherConfig:
    """teacher=none | self_hint (conf/teacher/): no teacher, or the policy given a hindsight hint
    (and the schema of a teacher kind of yours without fields of its own)."""

    # The kind's name in opd.teachers.TEACHERS, which refuses one not registered there (naming `teacher`).
    kind: str = checked(nonempty("a teacher kind (none, self_hint, model or one registered in opd.teachers)"))
    hint: bool = MISSING


@relation(TeacherConfig)
def none_or_self_hint(teacher: TeacherConfig, at: str) -> None:
    # The base schema is none's and self_hint's; teacher=model's fields come with ModelTeacherConfig.
    if type(teacher) is TeacherConfig:
        require(teacher.kind != "model", join(at, "kind"), "none or self_hint here; choose a teacher model with teacher=model", teacher.kind)
        require(teacher.hint == (teacher.kind == "self_hint"), join(at, "hint"), f"{teacher.kind == 'self_hint'} with teacher={teacher.kind}", teacher.hint)


@dataclass
class TeacherServerConfig:
    """teacher.server of teacher=model: where the teacher runs (conf/teacher/model.yaml)."""

    model: str = checked(nonempty("a model directory or name"))
    base_url: Optional[str] = checked(url(), null="served here")
    api_key: str = MISSING
    keepalive_s: float = checked(at_least(0.1))
    dtype: str = MISSING
    max_model_len: int = checked(at_least(16))
    cpu_kv_cache_gib: int = checked(at_least(1))
    startup_timeout_s: float = checked(at_least(1))
    extra_args: list[str] = MISSING
    max_restarts: int = checked(at_least(0))


@dataclass
class ModelTeacherConfig(TeacherConfig):
    """teacher=model: a separate model scores every sampled token (conf/teacher/model.yaml)."""

    topk: int = checked(at_least(1))
    max_concurrent: int = checked(at_least(1))
    server: TeacherServerConfig = MISSING


@relation(ModelTeacherConfig)
def model_kind_with_model_fields(teacher: ModelTeacherConfig, at: str) -> None:
    require(teacher.kind == "model", join(at, "kind"), "model with teacher=model's fields", teacher.kind)
