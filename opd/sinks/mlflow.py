"""MLflow: each group's metrics as histories at its step; at the end (also of a failed or killed
run) the data as artifacts under data/: groups.jsonl and its viewer."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from opd.sinks.base import Sink, Written
from opd.tracking.mlflow_run import Tracker

logger = logging.getLogger(__name__)


class MlflowMetrics(Sink):
    def __init__(self, tracker: Tracker, groups_path: Path, tokenizer: Any, upload_data: bool) -> None:
        self.tracker = tracker
        self.groups_path = groups_path
        self.tokenizer = tokenizer
        self.upload_data = upload_data

    async def write(self, written: Written) -> None:
        self.tracker.log_metrics(written.metrics, written.step)

    async def close(self, status: str) -> None:
        if self.upload_data and self.groups_path.exists():
            self._upload()

    def _upload(self) -> None:
        """groups.jsonl and its viewer as artifacts (best effort: never masks the run's own error)."""
        from opd.records.viewer import write_viewer
        from opd.run_files import check_name

        try:
            check_name(self.groups_path)  # a link put in its place is not followed into the artifacts
            self.tracker.log_artifact(self.groups_path, "data")
            viewer = write_viewer(self.groups_path, self.tokenizer, self.groups_path.with_name("groups.html"))
            self.tracker.log_artifact(viewer, "data")
        except Exception as err:  # noqa: BLE001 - logged; the data itself is safe on disk
            logger.warning("could not log the data artifacts: %s", err)
