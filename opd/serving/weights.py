"""The version of the weights the inference servers serve: one object owns it.

0 is the checkpoint the servers started with; the trainer in the run (`opd.sinks.trainer`) raises
it once the servers serve the weights of its next step. Environments read it when a group starts
and record it in the group (`group_overrides.weight_version`), so the trainer can tell how many
versions behind a group is; an environment worker in another process follows the driver's.
"""

from __future__ import annotations


class ServedWeights:
    """The served weights' version (see the module)."""

    def __init__(self, version: int = 0) -> None:
        self._version = version

    @property
    def version(self) -> int:
        return self._version

    def advance(self) -> int:
        """The servers now serve the next version (after a refresh): the new version."""
        self._version += 1
        return self._version

    def follow(self, version: int) -> None:
        """In an environment worker's copy: the driver's version, sent with each item (the driver's
        object is the one the trainer raises)."""
        self._version = version
