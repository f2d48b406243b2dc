"""The run's groups.jsonl: one flushed line per group (`opd.records.GroupWriter`)."""

from __future__ import annotations

from pathlib import Path

from opd.records import GroupWriter
from opd.sinks.base import Sink, Written


class GroupFile(Sink):
    def __init__(self, path: Path, fsync: bool = False) -> None:
        self.path = path
        self.fsync = fsync
        self.writer: GroupWriter | None = None

    async def open(self) -> None:
        self.writer = GroupWriter(self.path, fsync=self.fsync)

    async def write(self, written: Written) -> None:
        assert self.writer is not None, "GroupFile.write before open"
        self.writer.write(written.group)

    async def close(self, status: str) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
