"""``perf/mfu/actor`` (issue 28): FLOPs per token from an HF config as verl's ``FlopsCounter``
counts them, the device's peak bf16 rate by name, and the actor's update reporting it on a GPU
only (mocked here: no GPU, no metric on the CPU)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from flowrl.metrics.mfu import ModelFlops, UpdateMfu, mfu, peak_bf16_flops

# The session's tiny model: hidden 32, 2 layers, 4 query heads of 8, 2 KV heads, MLP 64, vocabulary 99.
TINY = SimpleNamespace(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=64, vocab_size=99)


def test_flops_per_token_by_hand():
    m = ModelFlops.from_hf_config(TINY)
    # per layer: MLP 3*32*64 = 6144, attention q,o 2*32*32 + k,v 2*32*16 = 3072 -> 9216; x2 layers = 18432;
    # embedding and head 2*99*32 = 6336 -> N = 24768. Attention term: head_dim 8 * 4 heads * 2 layers = 64.
    assert m == ModelFlops(dense_params=24768, attention=64)
    # sequences of 10 and 20 tokens: 6*N*30 = 4_458_240 dense, 6*64*(100+400) = 192_000 attention
    assert m.train_flops([10, 20]) == 4_458_240 + 192_000


def test_explicit_head_dim_wins():
    qwen3ish = SimpleNamespace(**{**vars(TINY), "head_dim": 16})
    assert ModelFlops.from_hf_config(qwen3ish).attention == 16 * 4 * 2


@pytest.mark.parametrize(("name", "peak"), [
    ("NVIDIA H200", 989e12), ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA A100-SXM4-80GB", 312e12),
    ("NVIDIA B200", 2.25e15), ("NVIDIA H20", 148e12), ("NVIDIA GeForce GTX 1080", None), (None, None),
])
def test_peak_by_device_name(name, peak):
    assert peak_bf16_flops(name) == peak


def test_mfu_divides_by_the_devices_of_a_replica():
    assert mfu(989e12, 2.0, 989e12) == 0.5
    assert mfu(989e12, 1.0, 989e12, num_devices=4) == 0.25
    assert UpdateMfu(ModelFlops(1, 0), 6.0, 1).of([1, 2], 1.0, epochs=2) == 2 * 6 * 3 / 6.0


def _batch(rows: int):
    from flowrl.data.packed import PackedBatch
    from flowrl_testing.fsdp import batch

    return PackedBatch.from_table(batch()).rows(0, rows)


def test_the_update_reports_mfu_only_with_a_peak():
    from flowrl.metrics import names
    from flowrl.roles.epochs import run_epochs

    packed = _batch(4)
    seqlens = (packed.prompt_cu_B1.diff() + packed.response_cu_B1.diff()).tolist()
    counter = UpdateMfu(ModelFlops.from_hf_config(TINY), 1e9, 1)
    out = run_epochs(packed, epochs=2, mini_batch_rows=2, step=lambda mb: {}, prefix=names.ACTOR, mfu=counter)
    seconds = out[names.update_stat(names.ACTOR, names.UPDATE_S)]
    assert out[names.MFU_ACTOR] == pytest.approx(counter.of(seqlens, seconds, epochs=2))
    assert names.MFU_ACTOR == "perf/mfu/actor"
    assert names.MFU_ACTOR not in run_epochs(packed, epochs=1, mini_batch_rows=2, step=lambda mb: {}, prefix=names.ACTOR)


def test_update_mfu_needs_a_gpu_of_known_peak(tiny_model_dir, monkeypatch):
    import torch

    from flowrl.roles.accounting import update_mfu

    assert update_mfu(str(tiny_model_dir), "cpu") is None  # the CPU: no metric
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    got = update_mfu(str(tiny_model_dir), "cuda:0", num_devices=2)
    assert got == UpdateMfu(ModelFlops.from_hf_config(TINY), 989e12, 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some Future GPU")
    assert update_mfu(str(tiny_model_dir), "cuda:0") is None
