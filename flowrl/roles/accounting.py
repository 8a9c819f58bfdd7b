"""Per-phase accounting of a worker (issue 14): its peak memory, and what its generation engine
computed, handed to the graph nodes with the results (``experience.with_stats``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

from flowrl.backends.interfaces import ReportsStats
from flowrl.data import experience
from flowrl.metrics import names

if TYPE_CHECKING:
    from flowrl.metrics.mfu import UpdateMfu


def peak_memory_gb(rss_name: str, device_name: str) -> dict[str, float]:
    """This process's peak resident memory, and on a GPU the peak memory torch allocated there, in GB."""
    import resource
    import sys

    import torch

    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    out = {rss_name: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 1e9}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out[device_name] = torch.cuda.max_memory_allocated() / 1e9
    return out


def update_mfu(model_dir: str, device: str, *, num_devices: int = 1) -> "UpdateMfu | None":
    """What a trainer on ``device`` needs to report its MFU (``flowrl.metrics.mfu``): the model's
    FLOPs per token from its config and the GPU's peak bf16 rate by its name; None on the CPU, on
    a GPU of unknown peak, or for a model whose config does not say its shape."""
    from flowrl.metrics.mfu import ModelFlops, UpdateMfu, peak_bf16_flops
    from flowrl.parallel.dtypes import device_kind

    if device_kind(device) != "cuda":
        return None
    import torch

    peak = peak_bf16_flops(torch.cuda.get_device_name(torch.device(device)))
    if peak is None:
        return None
    from transformers import AutoConfig

    try:
        model = ModelFlops.from_hf_config(AutoConfig.from_pretrained(model_dir))
    except (AttributeError, TypeError):  # not a Llama/Qwen2-shaped decoder: no estimate
        return None
    return UpdateMfu(model, peak, num_devices)


GEN_SLOTS = "gen_slots"
GEN_TOKENS = "gen_tokens"


def with_generation_stats(table: pa.Table, engine: Any) -> pa.Table:
    """``table`` carrying the engine's last decode counts (positions computed, real tokens fed:
    engines that keep ``last_stats``, the ``hf`` one) and this worker's peak memory."""
    stats = peak_memory_gb(names.ROLLOUT_MAX_RSS_GB, names.ROLLOUT_MAX_MEMORY_ALLOCATED_GB)
    last = engine.last_stats if isinstance(engine, ReportsStats) else None
    if last is not None:
        stats.update({GEN_SLOTS: float(last.slots), GEN_TOKENS: float(last.tokens)})
    return experience.with_stats(table, stats)


def generation_metrics(stats: dict[str, float], *, response_tokens: float, seconds: float) -> dict[str, float]:
    """``perf/gen_tokens_per_s`` (sampled tokens per second of the generation node),
    ``perf/gen_padding_ratio`` (positions computed per real token, when the engine counts them)
    and the rollout workers' peak memory."""
    out = {k: v for k, v in stats.items() if k.endswith("_gb")}
    out[names.GEN_TOKENS_PER_S] = response_tokens / max(seconds, 1e-9)
    if stats.get(GEN_TOKENS):
        out[names.GEN_PADDING_RATIO] = stats[GEN_SLOTS] / stats[GEN_TOKENS]
    return out
