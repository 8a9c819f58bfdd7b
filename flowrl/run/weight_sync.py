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
    """``reshard/*``, ``timing_s/reshard``, ``compute_s/reshard``, and a hybrid rank's hand-over
    seconds and phase memory peaks (``perf/hybrid_*``): what the sync reports."""
    return key.startswith((names.RESHARD_PREFIX, "perf/hybrid_")) or key in (names.timing(names.RESHARD), names.compute(names.RESHARD))


class RolloutsAhead:
    """``trainer.staleness`` = N: the generations submitted ahead of their steps, and the weight
    version each runs with.

    Before step k's graph is built, the generations of steps k .. k+N (not past the last step,
    nor past a *drain* step, see :meth:`fill`) are submitted as graphs of their own (the family's
    ``rollout``: rollout calls only). Step k's graph then binds its actor calls and its reshard,
    whose rollout call comes after gen(k+N): the rollout runs gen(k+1) .. gen(k+N) while the actor
    trains step k, and step k's weights reach it only after gen(k+N). Every generation submitted
    before step k's graph is built runs with the weights of step k (the k steps whose reshards are
    reserved ahead of it), so its version is the step being built at submission: ``max(start,
    j - N)`` for step j of a pipeline started at ``start``.

    Drain steps (the checkpoint steps of ``trainer.save_freq``) generate nothing ahead: the next
    step's generation waits for their weights, exactly as after a resume from their checkpoint,
    so a resumed run repeats the uninterrupted one. A checkpoint taken elsewhere (or a rebuild)
    drops what is in flight; those prompts are generated again, same seeds, with the restored
    weights (no prompt lost or trained twice)."""

    def __init__(self, staleness: int) -> None:
        self.staleness = staleness
        self._ahead: dict[int, tuple[Any, int]] = {}  # step -> (future of its rollout output, weight version)

    @property
    def enabled(self) -> bool:
        return self.staleness > 0

    def fill(self, step: int, last: int, submit: Any) -> None:
        """Before building step ``step``: submit ``submit(j, version)`` for steps ``step .. last``
        not yet submitted (``last``: ``step + staleness`` clipped by the caller), in order."""
        for j in range(step, last + 1):
            if j not in self._ahead:
                self._ahead[j] = (submit(j, step), step)

    def take(self, step: int) -> tuple[Any, int]:
        """The future of step ``step``'s generation and its weight version (submitted by :meth:`fill`)."""
        return self._ahead.pop(step)

    def in_flight(self) -> list[int]:
        """Steps generated ahead and not yet taken."""
        return sorted(self._ahead)

    def drain(self, timeout_s: float) -> None:
        """Wait for what is in flight (each has its reserved place in the rollout's call order,
        which later calls such as the teardown wait for), then forget it."""
        for future, _ in self._ahead.values():
            try:
                future.result(timeout=timeout_s)
            except Exception:  # noqa: BLE001 - a generation the run will not train; its error is moot
                pass
        self.drop()

    def drop(self) -> None:
        """Forget what is in flight (a rebuild: the session is gone); the futures are released."""
        for future, _ in self._ahead.values():
            try:
                future.release()
            except Exception:  # noqa: BLE001 - a dead session's future
                pass
        self._ahead.clear()


def lag_metrics(step: int, versions: Any, spans: dict[str, tuple[float, float]],
                previous: dict[str, tuple[float, float]] | None) -> dict[str, float]:
    """``async/*`` of step ``step``: the staleness of its samples (``step`` minus each row's
    ``weight_version``) and, against the previous step's spans, the rollout's idle time (from the
    end of the previous ``gen`` to the start of this one) and the trainer's (from the end of the
    previous ``update_actor`` to the start of this one, less this step's ``old_log_prob``)."""
    import numpy as np

    lag = step - np.asarray(versions, dtype=np.int64)
    out = {names.STALENESS_MEAN: float(lag.mean()), names.STALENESS_MAX: float(lag.max())}
    if previous:
        if "gen" in spans and "gen" in previous:
            out[names.ROLLOUT_IDLE] = max(0.0, spans["gen"][0] - previous["gen"][1])
        if "update_actor" in spans and "update_actor" in previous:
            busy = spans["old_log_prob"][1] - spans["old_log_prob"][0] if "old_log_prob" in spans else 0.0
            out[names.TRAINER_IDLE] = max(0.0, spans["update_actor"][0] - previous["update_actor"][1] - busy)
    return out
