"""What a vLLM worker reports of its KV cache (``vllm_memory.worker_memory_bytes``, run on the
worker by ``collective_rpc``): the model runner's cache tensors, nested lists walked, each storage
counted once, nothing while the cache sleeps."""

import types

import torch

from flowrl.backends.generate.vllm_memory import worker_memory_bytes


def _worker(kv_caches):
    return types.SimpleNamespace(model_runner=types.SimpleNamespace(kv_caches=kv_caches))


def test_each_cache_storage_counts_once():
    layer0, layer1 = torch.zeros(2, 8, dtype=torch.float32), torch.zeros(3, 4, dtype=torch.bfloat16)
    # a view of layer 0 (a second name for the same storage) and a None entry, as per-group lists do
    assert worker_memory_bytes(_worker([layer0, [layer1, layer0[1:]], None])) == {"kv_cache": 2 * 8 * 4 + 3 * 4 * 2}


def test_a_sleeping_cache_reports_nothing():
    assert worker_memory_bytes(_worker([])) == {"kv_cache": 0}
    assert worker_memory_bytes(types.SimpleNamespace(model_runner=types.SimpleNamespace())) == {"kv_cache": 0}
