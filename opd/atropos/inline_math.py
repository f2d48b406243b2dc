"""inline_math for atroposlib's commands: `python -m opd.atropos.inline_math serve|process ...`."""

from __future__ import annotations

import sys

if __name__ == "__main__":  # the options that can fail are checked before atroposlib's slow import
    from opd.atropos.precheck import main as precheck

    precheck(sys.argv[1:])

from atroposlib.envs.base import BaseEnv  # noqa: E402

from opd.atropos.env import AtroposEntry  # noqa: E402
from opd.envs.inline_math import InlineMathEnv  # noqa: E402


class InlineMathAtropos(AtroposEntry, InlineMathEnv, BaseEnv):
    """inline_math, built from atroposlib's config (see opd.atropos.env)."""

    opd_env = "inline_math"


if __name__ == "__main__":
    InlineMathAtropos.cli()
