"""flowrl.backends.train.megatron.compat: every patch exercised on CPU over gloo.

Which run reaches which patch (megatron-core 0.16.1 file:line, as in compat.py):

====  ==============================================================  =============================
#     patched path                                                    reached by
====  ==============================================================  =============================
1     torch.cuda.current_device (p2p, grad buffers, layers, RoPE)     every engine run; direct
2     torch.cuda.synchronize (p2p_communication.py:242 batched p2p)   "(1,1,2) llama bf16"; direct
3     schedules.py:596 (no pipelining)                                "(2,1,1) llama"
3     schedules.py:2138 (1F1B)                                        "(1,1,2) llama bf16"
3     schedules.py:983 (interleaved)                                  "... vpp2 ..."
3     optimizer.py:907 (FP32Optimizer)                                "(2,1,1) llama"
3     optimizer.py:485 (mixed-precision, no grad scaler)              bf16 runs
3     optimizer.py:473/481 (fp16 grad scaler; flowrl has no fp16)     direct (module's torch)
3     clip_grads.py:103/115/174, utils.py:1207 (l2 norm, clipping)    every train step; direct
3     clip_grads.py:90 (inf norm), :207 (zero count)                  direct
3     transformer/utils.py:35/40 (default causal / sliding masks)     direct (the engine passes
                                                                      its own mask)
4     random.py RNG tracker (seeding, fork in attention dropout)      every engine run; direct
5     optimizer.py:671-699 (Float16OptimizerWithFloat16Params)        "(1,1,2) llama bf16"
5     distrib_optimizer.py:361-435, :582 (DistributedOptimizer)       "... distopt"
5     clip_grads.py:167 (grad type assert)                            every train step
5     language_module.py:244 (tied embeddings, pp > 1)                "(1,1,2) qwen2 tied ..."
====  ==============================================================  =============================
"""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("megatron.core")

from flowrl.backends.train.megatron import compat  # noqa: E402
from flowrl.comm import free_port  # noqa: E402
from flowrl_testing import megatron as testing  # noqa: E402

BF16 = {"logp": 0.1, "entropy": 0.1, "state": 2e-2, "grad_norm_rel": 5e-2, "loss": 1e-2}
FP32 = {"logp": 1e-5, "entropy": 1e-5, "state": 1e-5, "grad_norm_rel": 1e-5, "loss": 1e-5}


@pytest.mark.skipif(torch.cuda.is_available(), reason="compat is a no-op with CUDA")
def test_refuses_before_init_process_group():
    assert not torch.distributed.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        compat.apply_cpu_compat()


@pytest.mark.skipif(torch.cuda.is_available(), reason="compat is a no-op with CUDA")
def test_refuses_untested_megatron_version(monkeypatch):
    monkeypatch.setattr(compat.importlib.metadata, "version", lambda name: "0.99.0")
    with pytest.raises(RuntimeError, match=r"tested with megatron-core \['0.16.1'\], found 0.99.0"):
        compat.apply_cpu_compat()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_noop_with_cuda():
    assert compat.apply_cpu_compat() is False


@pytest.mark.skipif(torch.cuda.is_available(), reason="compat is a no-op with CUDA")
def test_every_patched_path(tmp_path):
    models = {}
    for name, kwargs in (("llama", {"kind": "llama"}), ("qwen2", {"kind": "qwen2", "tied": True})):
        model_dir, ref_path = str(tmp_path / name), str(tmp_path / f"{name}.pt")
        ref = testing.prepare_reference(model_dir, ref_path, **kwargs)
        models[name] = ({"model_dir": model_dir, "ref_path": ref_path}, ref["grad_norm"])
    jobs = [
        {"name": "direct", "kind": "compat"},
        {"name": "(2,1,1) llama", **models["llama"][0], "dp": 2, "tp": 1, "pp": 1},
        {"name": "(1,1,2) llama bf16", **models["llama"][0], "dp": 1, "tp": 1, "pp": 2,
         "bf16": True},
        {"name": "(1,1,2) qwen2 tied vpp2 bf16 distopt", **models["qwen2"][0], "dp": 1, "tp": 1,
         "pp": 2, "vpp": 2, "bf16": True, "use_distributed_optimizer": True},
    ]
    out = tmp_path / "results.json"
    testing.spawn(testing.layouts_worker, world_size=2,
                  args=(2, free_port(), jobs, str(out)), timeout_s=240)
    direct, *runs = json.loads(out.read_text())

    assert direct["applied"] == [True, True]  # idempotent
    assert direct["current_device"] == "cpu"
    assert direct["causal_mask"] == [[0, 1, 1], [0, 0, 1], [0, 0, 0]]
    assert direct["sliding_mask_device"] == "cpu"
    # grads [3, -4] and [0, 12] on each of 2 ranks, reduced over the world
    assert direct["inf_norm"] == pytest.approx(12.0)
    assert direct["l2_norm"] == pytest.approx((2 * (9 + 16 + 144)) ** 0.5)
    assert direct["num_zeros"] == 2.0
    assert direct["optimizer_tensor_device"] == "cpu"
    assert direct["fork_advances"] and direct["default_rng_restored"]

    for run in runs:
        print(run)
        tol = BF16 if "bf16" in run["name"] else FP32
        ref_norm = models["qwen2" if "qwen2" in run["name"] else "llama"][1]
        assert max(run["logp@1.0"], run["logp@0.7"]) <= tol["logp"], run
        assert max(run["entropy@1.0"], run["entropy@0.7"]) <= tol["entropy"], run
        assert run["state"] <= tol["state"], run
        assert run["grad_norm"] <= tol["grad_norm_rel"] * ref_norm, run
        assert run["dp_identical"], run
