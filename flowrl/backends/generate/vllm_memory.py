"""What a vLLM engine holds, in tensor bytes, read on its workers (``LLM.collective_rpc`` with
:func:`worker_memory_bytes`): its KV cache, each storage counted once. Its weights are not counted:
vLLM's CPU build repacks each linear weight into a GEMM handle held in a closure, leaving an empty
parameter, so no tensor walk sees them.

The hybrid placement's memory line (``perf/hybrid_*_bytes``, :mod:`flowrl.roles.hybrid`) compares
a rank's peak with its trainer's state plus this KV cache. Kept free of module-level vLLM imports:
vLLM runs the function in its worker, where it only reads attributes.
"""

from __future__ import annotations

from typing import Any, Iterable

__all__ = ["engine_memory_bytes", "storage_bytes", "worker_memory_bytes"]


def storage_bytes(tensors: Iterable[Any], seen: set[int] | None = None) -> int:
    """Bytes of the distinct storages under ``tensors`` (nested lists and tuples walked; None
    skipped); ``seen``: storage addresses already counted, updated."""
    seen = set() if seen is None else seen
    total = 0
    for t in tensors:
        if t is None:
            continue
        if isinstance(t, (list, tuple)):
            total += storage_bytes(t, seen)
            continue
        storage = t.untyped_storage()
        if t.numel() == 0 or storage.data_ptr() in seen:
            continue
        seen.add(storage.data_ptr())
        total += storage.nbytes()
    return total


def worker_memory_bytes(worker: Any) -> dict[str, int]:
    """On a vLLM worker (``self`` of a ``collective_rpc`` callable): ``kv_cache``, the model
    runner's KV cache tensors (none while the cache sleeps)."""
    return {"kv_cache": storage_bytes(getattr(worker.model_runner, "kv_caches", []) or [])}


def engine_memory_bytes(generator: Any) -> dict[str, int]:
    """A ``VLLMGenerator``'s tensor bytes over its workers (its ``memory_bytes`` method):
    ``kv_cache``, summed."""
    return {"kv_cache": sum(w["kv_cache"] for w in generator.llm.collective_rpc(worker_memory_bytes))}
