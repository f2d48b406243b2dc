"""MLflow tracing (tracking.traces=true): one trace per rollout.

A `Tracer` is built once per run and handed to whatever makes spans (the environment, the agent
loop, the OPD stage). A rollout's root span is opened when its group starts and closed when the
group is scored, so the judge votes and teacher scoring that run after all rollouts of the group
still land in the rollout's own trace. Inside it, `span()` opens a child of the current span (a
context variable, copied into each asyncio task), for every model call, tool call, judge request
and teacher scoring. A disabled tracer (`Tracer.off()`) makes every call a cheap no-op.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from typing import Any, Iterator

logger = logging.getLogger(__name__)


class Span:
    """What `span()` yields: set the outputs of the call it wraps (ignored when not recorded)."""

    def __init__(self, live: Any) -> None:
        self.live = live

    @property
    def active(self) -> bool:
        """True when this span is recorded (compute costly outputs only then)."""
        return self.live is not None

    def outputs(self, value: Any) -> None:
        if self.live is not None:
            self.live.set_outputs(value)


class Tracer:
    def __init__(self, enabled: bool, experiment_id: str | None = None) -> None:
        self.enabled = enabled
        self.experiment_id = experiment_id
        self._current: contextvars.ContextVar[Any] = contextvars.ContextVar("opd_trace_span", default=None)

    @classmethod
    def off(cls) -> "Tracer":
        return cls(False)

    def start_root(self, name: str, inputs: dict[str, Any]) -> Any:
        """A new trace's root span (None when off); end it with `end_root`."""
        if not self.enabled:
            return None
        import mlflow

        return mlflow.start_span_no_context(name, span_type="AGENT", inputs=inputs, experiment_id=self.experiment_id)

    def end_root(self, root: Any, outputs: Any = None, error: BaseException | None = None) -> None:
        if root is None:
            return
        if error is not None:
            root.record_exception(error)
        root.end(outputs=outputs)

    @contextlib.contextmanager
    def attach(self, root: Any) -> Iterator[None]:
        """Make `root` the current span inside the block (spans opened there become its children)."""
        if root is None:
            yield
            return
        token = self._current.set(root)
        try:
            yield
        finally:
            self._current.reset(token)

    @contextlib.contextmanager
    def span(self, name: str, kind: str, inputs: dict[str, Any] | None = None) -> Iterator[Span]:
        """A child span of the current span; nothing (and no trace) when off or outside a rollout."""
        parent = self._current.get()
        if not self.enabled or parent is None:
            yield Span(None)
            return
        import mlflow

        live = mlflow.start_span_no_context(name, span_type=kind, parent_span=parent, inputs=inputs)
        token = self._current.set(live)
        try:
            yield Span(live)
        except BaseException as err:
            live.record_exception(err)
            raise
        finally:
            self._current.reset(token)
            live.end()

    def flush(self) -> None:
        """Wait for traces still being exported in the background."""
        if not self.enabled:
            return
        import mlflow

        try:
            mlflow.flush_trace_async_logging()
        except Exception as err:  # exporting is best effort; the run's data does not depend on it
            logger.warning("flushing traces failed: %s", err)
