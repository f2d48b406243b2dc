"""Loss terms that need teacher rows (opd/train/teacher_terms.py), and the experiment's arms
(conf/arm/, conf/experiment/opd_vs_grpo.yaml): one budget, loss weights the only difference."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from conftest import compose
from opd.config import ConfigError, validate
from test_train import recorded_group

torch = pytest.importorskip("torch")


def test_the_terms_said_to_need_teacher_rows_are_exactly_those_that_learn_nothing_without_them() -> None:
    from opd.train.batch import make_batch
    from opd.train.losses import LOSS_TERMS, terms
    from opd.train.teacher_terms import teacher_terms

    needs_teacher = teacher_terms()
    assert set(needs_teacher) <= set(LOSS_TERMS)
    logits = torch.randn(2, 9, 64, generator=torch.Generator().manual_seed(0))

    def gradient(name: str, teacher: bool) -> float:
        x = logits.clone().requires_grad_(True)
        loss = terms(x, make_batch([recorded_group([0.0, 1.0], teacher=teacher)]), 0.2, names=[name]).losses[name]
        if not loss.requires_grad:
            return 0.0
        loss.backward()
        return float(x.grad.abs().sum()) if x.grad is not None else 0.0

    for name in LOSS_TERMS:
        without = gradient(name, teacher=False)
        if name in needs_teacher:
            assert without == 0.0, f"{name} learns from records without teacher rows"
            assert gradient(name, teacher=True) > 0, f"{name} learns nothing from teacher rows either"
        else:
            assert without > 0, f"{name} needs teacher rows but is not registered with needs_teacher=True"


def test_teacher_rows_come_from_a_teacher_model_or_the_enabled_self_hint_teacher_and_never_from_plain_inline_math() -> None:
    from opd.teachers import teacher_of

    def rows(overrides: list[str]) -> str | None:
        return teacher_of(validate(compose(overrides))).rows()

    assert rows(["trainer=local"]) is None
    assert rows(["env=opd_coding", "trainer=local"]) == "teacher=self_hint (env.opd.enabled)"
    # teacher=self_hint without its judge hints nothing, so it writes no rows.
    assert rows(["env=opd_coding", "env.opd.enabled=false", "trainer=local"]) is None
    assert rows(["trainer=local", "teacher=model", "teacher.server.model=fixture"]) == "teacher=model"
    assert rows(["env=opd_coding", "teacher=model", "teacher.server.model=fixture", "trainer=local"]) == "teacher=model"


def test_a_teacher_term_with_nothing_to_read_is_refused_alone_and_said_beside_pg(caplog: pytest.LogCaptureFixture) -> None:
    from opd.teachers import teacher_of
    from opd.train.teacher_terms import check_loss_weights as check_weights

    def check_loss_weights(cfg: Any) -> None:  # against the rows its teacher writes
        check_weights(cfg, teacher_of(cfg).rows())

    with pytest.raises(ConfigError, match="trainer.loss: opd_advantage=1 needs teacher rows and env=inline_math without a teacher writes none") as info:
        check_loss_weights(validate(compose(["arm=opd"])))
    assert info.value.key == "trainer.loss"
    with caplog.at_level(logging.INFO, logger="opd.train.teacher_terms"):
        check_loss_weights(validate(compose(["arm=mix"])))
    assert "opd_advantage=1 adds nothing here (env=inline_math without a teacher writes no teacher rows); only pg trains" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="opd.train.teacher_terms"):
        check_loss_weights(validate(compose(["arm=grpo"])))
        check_loss_weights(validate(compose(["env=opd_coding", "arm=opd"])))  # the hinted teacher writes rows
        check_loss_weights(SimpleNamespace(env=validate(compose(["arm=opd"])).env, trainer=validate(compose(["arm=opd"])).trainer,
                                           teacher=SimpleNamespace(kind="model")))
    assert caplog.text == ""


def test_each_arm_sets_every_loss_weight_and_selects_the_reference_trainer() -> None:
    weights = {arm: dict(validate(compose([f"arm={arm}"])).trainer.loss) for arm in ("grpo", "opd", "opd_topk", "mix")}
    assert weights == {"grpo": {"pg": 1.0, "opd_advantage": 0.0, "topk_kl": 0.0},
                       "opd": {"pg": 0.0, "opd_advantage": 1.0, "topk_kl": 0.0},
                       "opd_topk": {"pg": 0.0, "opd_advantage": 0.0, "topk_kl": 1.0},
                       "mix": {"pg": 1.0, "opd_advantage": 1.0, "topk_kl": 0.0}}
    assert validate(compose(["arm=grpo"])).trainer.kind == "local"
    # The command line still wins over an arm.
    assert validate(compose(["arm=opd", "trainer.loss.topk_kl=0.5"])).trainer.loss["topk_kl"] == 0.5


def test_the_experiments_arms_share_one_budget_and_differ_only_in_the_loss_weights() -> None:
    from omegaconf import OmegaConf

    from opd.config import compose as compose_with_hydra

    configs = {arm: validate(compose(["experiment=opd_vs_grpo", f"arm={arm}"])) for arm in ("grpo", "opd", "opd_topk")}
    flat = {arm: OmegaConf.to_container(OmegaConf.structured(cfg)) for arm, cfg in configs.items()}
    for tree in flat.values():  # an arm is its loss, the learning rate included in what they share
        del tree["trainer"]["loss"]
    assert flat["grpo"] == flat["opd"] == flat["opd_topk"]
    cfg = configs["opd_topk"]
    # Budgeted in optimiser steps: 8 groups (64 rollouts) per step, 20 of them, on all nine kinds.
    assert cfg.dataset.kinds is None and cfg.trainer.kind == "local" and cfg.trainer.batch_groups == 8 and cfg.total_steps == 160
    assert cfg.server.model == "fixture_student" and cfg.teacher.server.model == "fixture_teacher" and cfg.eval.teacher
    assert cfg.sweep.objective == "summary/gap_closed" and cfg.eval.samples_per_item > 0 and cfg.eval.seed is not None
    sweeper = compose_with_hydra(["experiment=opd_vs_grpo"], hydra=True).hydra.sweeper.params
    assert dict(sweeper) == {"arm": "grpo,opd,opd_topk"}
