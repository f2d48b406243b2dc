"""opd_coding for atroposlib's commands: `python -m opd.atropos.opd_coding serve|process ...`."""

from __future__ import annotations

import sys

if __name__ == "__main__":  # the options that can fail are checked before atroposlib's slow import
    from opd.atropos.precheck import main as precheck

    precheck(sys.argv[1:])

from atroposlib.envs.base import BaseEnv  # noqa: E402

from opd.atropos.env import AtroposEntry  # noqa: E402
from opd.envs.opd_coding import OPDCodingEnv  # noqa: E402


class OPDCodingAtropos(AtroposEntry, OPDCodingEnv, BaseEnv):
    """opd_coding, built from atroposlib's config (see opd.atropos.env)."""

    opd_env = "opd_coding"


if __name__ == "__main__":
    OPDCodingAtropos.cli()
