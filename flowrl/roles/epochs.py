"""The PPO update loop shared by the actor and the critic: epochs over mini-batches."""

from __future__ import annotations

import time
from typing import Callable

from flowrl.data.packed import PackedBatch
from flowrl.metrics import names


def run_epochs(
    batch: PackedBatch, *, epochs: int, mini_batch_rows: int, step: Callable[[PackedBatch], dict[str, float]], prefix: str
) -> dict[str, float]:
    """``epochs`` passes over ``batch``, one ``step`` (an optimizer step) per mini-batch of
    ``mini_batch_rows`` rows; returns each stat averaged over the steps as ``<prefix>/<stat>``,
    plus ``<prefix>/num_optimizer_steps`` and ``<prefix>/update_s``."""
    history: dict[str, list[float]] = {}
    start = time.perf_counter()
    for _ in range(epochs):
        for first in range(0, batch.num_rows, mini_batch_rows):
            stats = step(batch.rows(first, min(first + mini_batch_rows, batch.num_rows)))
            for k, v in stats.items():
                history.setdefault(k, []).append(v)
    metrics = {names.update_stat(prefix, k): sum(v) / len(v) for k, v in history.items()}
    metrics[names.update_stat(prefix, names.NUM_OPTIMIZER_STEPS)] = float(len(history.get(names.GRAD_NORM, [])))
    metrics[names.update_stat(prefix, names.UPDATE_S)] = time.perf_counter() - start
    return metrics
