"""Metric sinks: ``metrics.jsonl`` (one JSON object per step) and the console line."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import IO

#: The keys shown on the console line, in order, with their short labels.
CONSOLE_KEYS = (
    ("critic/score/mean", "score"),
    ("actor/pg_loss", "pg_loss"),
    ("actor/kl_loss", "kl"),
    ("actor/entropy", "entropy"),
    ("actor/grad_norm", "grad"),
    ("response_length/mean", "resp_len"),
    ("perf/throughput", "tok/s"),
    ("timing_s/step", "step_s"),
)


class JsonlLogger:
    """Appends one JSON object per step; flushed at once so a crash loses no finished step."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fh: IO[str] | None = open(self.path, "a")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        assert self._fh is not None, "logger closed"
        row = {"step": step, **{k: _finite(v) for k, v in sorted(metrics.items())}}
        self._fh.write(json.dumps(row) + "\n")
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def _finite(v: float) -> float | None:
    v = float(v)
    return v if math.isfinite(v) else None


def read_metrics(path: str | Path) -> list[dict]:
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def console_line(step: int, total: int, metrics: dict[str, float]) -> str:
    parts = [f"step {step + 1}/{total}"]
    for key, label in CONSOLE_KEYS:
        if key in metrics:
            v = metrics[key]
            parts.append(f"{label}={v:.3f}" if abs(v) < 1000 else f"{label}={v:.0f}")
    return "  ".join(parts)
