"""The weight sync that overlaps the next submission, and the step timeline it completes.

A step's result does not wait for its weight sync (the ``reshard`` output of the iteration
graph): the rollout group runs its calls in reserved order, so the next ``gen`` cannot start
before the sync has written the new weights, and the driver submits the next graph meanwhile.
:class:`PendingSync` holds that future until the next step (or a checkpoint, or the end)
collects it; its metrics (``reshard/*``, ``timing_s/reshard``) land in the step that collected
them, and its node spans complete the synced step's rows of ``timeline.jsonl``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flowrl.metrics import names
from flowrl.metrics.timeline import TIMELINE_FILE, append_rows, span_rows


class PendingSync:
    """At most one in-flight weight sync, and the metrics collected from it ahead of time."""

    def __init__(self, run_dir: Path, timeout_s: float) -> None:
        self.run_dir = run_dir
        self.timeout_s = timeout_s
        self._future: Any = None
        self._timeline: tuple[int, float, set[str]] | None = None  # (step, submit time, nodes written)
        self._early: dict[str, float] = {}  # collected by a checkpoint, reported with the next step

    def record_step(self, step: int, submitted: float, spans: dict[str, tuple[float, float]], sync: Any) -> None:
        """Step ``step`` finished: write its node spans and hold its still-running ``sync``."""
        append_rows(self.run_dir / TIMELINE_FILE, span_rows(step, submitted, spans))
        self._timeline = (step, submitted, set(spans))
        self._future = sync

    def collect(self) -> dict[str, float]:
        """Wait for the held sync; write its spans; return its metrics (raises its error)."""
        if self._future is None:
            return {}
        future, self._future = self._future, None
        try:
            out = future.result(timeout=self.timeout_s)
            if self._timeline is not None:
                step, submitted, written = self._timeline
                self._timeline = None
                append_rows(self.run_dir / TIMELINE_FILE, span_rows(step, submitted, out.spans, skip=written))
            return {k: v for k, v in out.metrics.items() if _is_sync_metric(k)}
        finally:
            future.release()

    def collect_early(self) -> None:
        """Collect now (before a checkpoint); the metrics go out with the next step's."""
        self._early.update(self.collect())

    def take(self) -> dict[str, float]:
        """Metrics for the step being reported: those collected early, then the held sync's."""
        metrics, self._early = self._early, {}
        metrics.update(self.collect())
        return metrics

    def drop(self) -> None:
        """Forget the futures of a lost session (its spans never come)."""
        self._future, self._timeline, self._early = None, None, {}


def _is_sync_metric(key: str) -> bool:
    """``reshard/*``, ``timing_s/reshard``, ``compute_s/reshard``: what the sync reports."""
    return key.startswith(names.RESHARD_PREFIX) or key in (names.timing(names.RESHARD), names.compute(names.RESHARD))
