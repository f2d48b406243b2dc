"""Which `trainer.loss` terms learn only from teacher rows, and the check that a run writes some
for them (whether it does is its teacher's to say: `rows()` in opd.teachers).

A loss whose every weighted term needs teacher rows trains nothing in a run whose records carry
none (inline_math without a teacher and `pg=0`): `check_loss_weights` refuses it before any server
starts. A weighted teacher term beside `pg` in such a run only adds nothing: said once, in the log.
"""

from __future__ import annotations

import logging
from typing import Any

from opd.config import ConfigError

logger = logging.getLogger(__name__)

def teacher_terms() -> list[str]:
    """The loss terms that read only the teacher's rows (`overrides[i].teacher_logprobs`,
    `distill_token_ids`/`distill_logprobs`): those registered with `needs_teacher=True`
    (opd/train/losses.py), 0 with no gradient on records without them."""
    from opd.train import losses

    return [entry.name for entry in losses.LOSS_TERMS.where(needs_teacher=True)]


def check_loss_weights(cfg: Any, source: str | None) -> None:
    """Refuse (ConfigError naming `trainer.loss`) a loss that would train nothing: every non-zero
    weight on a term that needs teacher rows where nothing writes them (`source`: what writes this
    run's teacher rows, the teacher's `rows()` in opd.teachers; None: nothing). All weights 0 fail
    earlier, in the schema."""
    weights = {name: float(weight) for name, weight in cfg.trainer.loss.items() if weight}
    if source is not None:
        return
    idle = sorted(set(weights) & set(teacher_terms()))
    given = ", ".join(f"{name}={weights[name]:g}" for name in idle)
    kind = getattr(getattr(cfg, "teacher", None), "kind", "none")
    where = f"env={cfg.env.name} without a teacher" if kind == "none" else f"teacher={kind} with env.opd.enabled=false"
    if len(idle) == len(weights):
        raise ConfigError(f"trainer.loss: {given} {'needs' if len(idle) == 1 else 'need'} teacher rows and {where} writes none, so trainer=local would train nothing; "
                          "give trainer.loss.pg a weight > 0 (arm=grpo, arm=mix) or the run a teacher", "trainer.loss")
    if idle:
        trained = sorted(set(weights) - set(idle))
        logger.info("trainer.loss: %s %s nothing here (%s writes no teacher rows); only %s %s", given, "adds" if len(idle) == 1 else "add",
                    where, ", ".join(trained), "trains" if len(trained) == 1 else "train")
