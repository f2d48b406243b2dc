"""`sinks: [..., parquet]`: when the run ends, its groups.jsonl as a dataset, one row per rollout,
in `<run dir>/dataset/groups.parquet` (the folder: `sink_settings.parquet.dir`;
`opd.records.export`, docs/records.md), which `datasets.load_dataset("parquet", data_dir=...)`
loads. Written once, from the file, whatever the run's end: a killed or resumed run's export holds
every group its file holds."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from opd.records.escape import console
from opd.records.export import ExportError, Exported, export_file, log_skips
from opd.sinks.base import Sink, Written

logger = logging.getLogger(__name__)


class ParquetExport(Sink):
    def __init__(self, groups_path: Path, out_dir: Path, model: str | None) -> None:
        self.groups_path, self.out_dir, self.model = groups_path, out_dir, model
        self.done: Exported | None = None

    async def write(self, written: Written) -> None:
        """Nothing per group: the export reads the file at the end."""

    async def close(self, status: str) -> None:
        if not self.groups_path.exists():
            return
        try:
            self.done = await asyncio.to_thread(export_file, self.groups_path, self.out_dir, "parquet", self.model, replace=True)
        except ExportError as err:
            logger.warning("parquet sink: nothing exported: %s", console(str(err)))
            return
        log_skips(self.groups_path, self.done.skipped)
        logger.info("parquet sink: %d rollouts of %d groups in %s", self.done.rows, self.done.groups, console(str(self.done.path)))

    def summary(self) -> dict[str, float]:
        return {} if self.done is None else {"summary/parquet_rows": float(self.done.rows)}
