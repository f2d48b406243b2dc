"""inline_math for atroposlib's commands: `python -m opd.atropos.inline_math serve|process ...`."""

from __future__ import annotations

from atroposlib.envs.base import BaseEnv

from opd.atropos.env import AtroposEntry
from opd.envs.inline_math import InlineMathEnv


class InlineMathAtropos(AtroposEntry, InlineMathEnv, BaseEnv):
    """inline_math, built from atroposlib's config (see opd.atropos.env)."""

    opd_env = "inline_math"


if __name__ == "__main__":
    InlineMathAtropos.cli()
