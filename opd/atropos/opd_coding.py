"""opd_coding for atroposlib's commands: `python -m opd.atropos.opd_coding serve|process ...`."""

from __future__ import annotations

from atroposlib.envs.base import BaseEnv

from opd.atropos.env import AtroposEntry
from opd.envs.opd_coding import OPDCodingEnv


class OPDCodingAtropos(AtroposEntry, OPDCodingEnv, BaseEnv):
    """opd_coding, built from atroposlib's config (see opd.atropos.env)."""

    opd_env = "opd_coding"


if __name__ == "__main__":
    OPDCodingAtropos.cli()
