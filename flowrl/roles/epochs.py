"""The PPO update loop shared by the actor and the critic: epochs over mini-batches."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

from flowrl.data.packed import PackedBatch
from flowrl.metrics import names
from flowrl.roles.accounting import peak_memory_gb

if TYPE_CHECKING:
    from flowrl.metrics.mfu import UpdateMfu


def run_epochs(
    batch: PackedBatch, *, epochs: int, mini_batch_rows: int, step: Callable[[PackedBatch], dict[str, float]], prefix: str,
    mfu: "UpdateMfu | None" = None,
) -> dict[str, float]:
    """``epochs`` passes over ``batch``, one ``step`` (an optimizer step) per mini-batch of
    ``mini_batch_rows`` rows; returns each stat averaged over the steps as ``<prefix>/<stat>``,
    plus ``<prefix>/num_optimizer_steps``, ``<prefix>/update_s``, :func:`phase_metrics` and, with
    ``mfu`` (a GPU of known peak), ``perf/mfu/actor``: this rank's rows, every epoch."""
    history: dict[str, list[float]] = {}
    start = time.perf_counter()
    for _ in range(epochs):
        for first in range(0, batch.num_rows, mini_batch_rows):
            stats = step(batch.rows(first, min(first + mini_batch_rows, batch.num_rows)))
            for k, v in stats.items():
                history.setdefault(k, []).append(v)
    update_s = time.perf_counter() - start
    slots, tokens = sum(history.pop(names.TRAIN_SLOTS, [])), sum(history.pop(names.TRAIN_TOKENS, []))
    metrics = {names.update_stat(prefix, k): sum(v) / len(v) for k, v in history.items()}
    metrics[names.update_stat(prefix, names.NUM_OPTIMIZER_STEPS)] = float(len(history.get(names.GRAD_NORM, [])))
    metrics[names.update_stat(prefix, names.UPDATE_S)] = update_s
    if mfu is not None and batch.num_rows:
        seqlens = (batch.prompt_cu_B1.diff() + batch.response_cu_B1.diff()).tolist()
        metrics[names.MFU_ACTOR] = mfu.of(seqlens, update_s, epochs=epochs)
    return {**metrics, **phase_metrics(prefix, slots=slots, tokens=tokens, seconds=update_s)}


def phase_metrics(prefix: str, *, slots: float, tokens: float, seconds: float) -> dict[str, float]:
    """The update's per-phase accounting: real tokens (all ranks) per second, positions computed
    per real token, and this process's peak memory (actor only: ``perf/max_rss_gb``, on GPU
    ``perf/max_memory_allocated_gb``). Nothing without the engine's counts (megatron)."""
    if tokens <= 0:
        return {}
    actor = prefix == names.ACTOR
    out = {
        names.TRAIN_TOKENS_PER_S if actor else names.CRITIC_TRAIN_TOKENS_PER_S: tokens / max(seconds, 1e-9),
        names.TRAIN_PADDING_RATIO if actor else names.CRITIC_TRAIN_PADDING_RATIO: slots / tokens,
    }
    if actor:
        out.update(peak_memory_gb(names.MAX_RSS_GB, names.MAX_MEMORY_ALLOCATED_GB))
    return out
