"""Cross-layout checkpoints: save sharded under one mesh, load under another, bit for bit.

Reference: ``shard_arrays(spec, full, key)`` cuts the expected local tensors out of the full state.
Model letters as in ``flowrl.parallel.shard_spec``; V=37 is odd so vocabulary padding and a partial
last chunk are exercised.
"""

from __future__ import annotations

import os
import re
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowrl.checkpoint import (begin_checkpoint, finalize_checkpoint, load_full, load_meta,
                               load_shard, write_shard)
from flowrl.checkpoint.chunk_plan import chunk_owners, chunk_shape, spec_chunks
from flowrl.parallel.mesh import ParallelDims
from flowrl.parallel.shard_spec import ModelShape, shard_arrays, shard_spec


def _model(num_layers: int = 2, *, qkv_bias: bool = True, tied: bool = False) -> ModelShape:
    return ModelShape(vocab_size=37, hidden_size=16, ffn_hidden_size=32, num_layers=num_layers,
                      num_heads=4, num_kv_heads=2, head_dim=4, qkv_bias=qkv_bias,
                      tied_embeddings=tied)


def _full(model: ModelShape, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in model.param_shapes().items()}


def _save_sharded(path: str, spec, full, *, step: int = 1, optim: bool = False) -> str:
    """Every global rank writes its shard (dp replicas > 0 are no-ops), then rank 0 finalizes."""
    tmp = begin_checkpoint(path, spec, optim_states=("exp_avg",) if optim else ())
    for rank in range(spec.dims.world_size):
        key = spec.shard_of(rank)
        local = shard_arrays(spec, full, (key.tp_rank, key.pp_rank))
        moments = {"exp_avg": shard_arrays(spec, {n: 2 * a for n, a in full.items()},
                                           (key.tp_rank, key.pp_rank))} if optim else None
        write_shard(tmp, spec, rank, local, optim=moments)
    return finalize_checkpoint(tmp, step=step)


def _assert_shard_equal(got: dict, expected: dict) -> None:
    assert got.keys() == expected.keys()
    for name in expected:
        assert got[name].dtype == expected[name].dtype, name
        assert np.array_equal(got[name], expected[name]), name


def test_chunks_follow_tp_shards() -> None:
    # tp=2, V=37, make_vocab_size_divisible_by=1: Vp=38, 19 rows per rank -> chunk 19 (last 18).
    # q_proj: 4 heads * 4 = 16 rows, 2 KV groups of 2 q heads (8 rows), rank r holds group r: 8.
    # o_proj (16, 16) row parallel: split dim 1, 8 columns each. Norms: one chunk.
    spec = shard_spec(_model(), ParallelDims(dp=1, tp=2, pp=1), make_vocab_size_divisible_by=1)
    chunks = spec_chunks(spec, {n: 4 for n in spec.params})
    assert chunks["model.embed_tokens.weight"] == (19, 16)
    assert chunks["model.layers.0.self_attn.q_proj.weight"] == (8, 16)
    assert chunks["model.layers.0.self_attn.k_proj.weight"] == (4, 16)
    assert chunks["model.layers.0.self_attn.o_proj.weight"] == (16, 8)
    assert chunks["model.layers.0.mlp.gate_proj.weight"] == (16, 16)
    assert chunks["model.layers.0.input_layernorm.weight"] == (16,)
    owners = chunk_owners(spec, chunks)
    assert owners["model.layers.0.self_attn.q_proj.weight"] == [(0, 0), (1, 0)]
    assert owners["model.layers.0.input_layernorm.weight"] == [(0, 0)]  # replicated: tp 0 writes


def test_chunk_cap_keeps_shard_alignment() -> None:
    # 12 rows of 1 KiB cut at 6, cap 3 KiB: the largest divisor of 6 that fits is 3 rows.
    assert chunk_shape((12, 256), 0, {6}, 4, max_chunk_bytes=3 * 1024) == (3, 256)
    # row parallel (4, 12) split dim 1 at 6, cap 32 B: 1 column is 16 B -> 2 columns (divisor of
    # 6), then dim 0 still fits whole.
    assert chunk_shape((4, 12), 1, {6}, 4, max_chunk_bytes=32) == (4, 2)


@pytest.mark.parametrize("tied", [False, True])
def test_save_tp2_pp2_load_tp1_tp4_vllm(tmp_path, tied: bool) -> None:
    model = _model(4, tied=tied)
    full = _full(model)
    src = shard_spec(model, ParallelDims(dp=2, tp=2, pp=2))
    path = _save_sharded(str(tmp_path / "step_1"), src, full, optim=True)
    assert load_meta(path)["layout"]["tp"] == 2
    loaded = load_full(path)
    assert all(np.array_equal(loaded[n], full[n]) for n in full)
    for dims, style in [(ParallelDims(dp=4, tp=1, pp=1), "megatron"),
                        (ParallelDims(dp=1, tp=4, pp=1), "megatron"),
                        (ParallelDims(dp=1, tp=1, pp=4), "megatron"),
                        (ParallelDims(dp=1, tp=4, pp=2), "vllm")]:
        dst = shard_spec(model, dims, style=style)
        for key in dst.shards:
            _assert_shard_equal(load_shard(path, dst, key), shard_arrays(dst, full, key))
        doubled = {n: 2 * a for n, a in full.items()}
        _assert_shard_equal(load_shard(path, dst, (0, 0), state="exp_avg"),
                            shard_arrays(dst, doubled, (0, 0)))


_DIMS = st.sampled_from([(1, 1, 1, None), (2, 1, 1, None), (1, 2, 1, None), (1, 4, 1, None),
                         (1, 1, 2, None), (1, 2, 2, None), (2, 2, 2, None), (1, 4, 2, None),
                         (1, 1, 2, 2), (1, 2, 2, 2)])


@settings(max_examples=12, deadline=None)
@given(src=_DIMS, dst=_DIMS, style=st.sampled_from(["megatron", "vllm"]),
       div_src=st.sampled_from([1, 8, 128]), div_dst=st.sampled_from([1, 128]),
       tied=st.booleans(), qkv_bias=st.booleans())
def test_any_layout_to_any_layout(src, dst, style, div_src, div_dst, tied, qkv_bias) -> None:
    vpp = None if style == "vllm" else dst[3]
    model = _model(4 if src[3] or vpp else 2, qkv_bias=qkv_bias, tied=tied)  # pp*vpp | layers
    full = _full(model, seed=1)
    src_spec = shard_spec(model, ParallelDims(dp=src[0], tp=src[1], pp=src[2], vpp=src[3]),
                          make_vocab_size_divisible_by=div_src)
    dst_spec = shard_spec(model, ParallelDims(dp=dst[0], tp=dst[1], pp=dst[2], vpp=vpp),
                          style=style, make_vocab_size_divisible_by=div_dst)
    with tempfile.TemporaryDirectory() as root:
        path = _save_sharded(os.path.join(root, "ckpt"), src_spec, full)
        for key in dst_spec.shards:
            _assert_shard_equal(load_shard(path, dst_spec, key), shard_arrays(dst_spec, full, key))


def test_load_reads_only_needed_chunks(tmp_path, monkeypatch) -> None:
    from zarr.storage import LocalStore

    model = _model(2)
    full = _full(model)
    src = shard_spec(model, ParallelDims(dp=1, tp=2, pp=2))
    path = _save_sharded(str(tmp_path / "step_1"), src, full)
    reads: list[str] = []
    original = LocalStore.get

    async def counting_get(self, key, *args, **kwargs):
        reads.append(key)
        return await original(self, key, *args, **kwargs)

    monkeypatch.setattr(LocalStore, "get", counting_get)
    # Target tp=2, pp=1, shard (1, 0): q_proj chunks are 8 rows (one KV group); it needs group 1
    # only -> c/1/0. o_proj (16, 16) chunks are 8 columns; it needs columns 8..16 -> c/0/1.
    dst = shard_spec(model, ParallelDims(dp=1, tp=2, pp=1))
    _assert_shard_equal(load_shard(path, dst, (1, 0)), shard_arrays(dst, full, (1, 0)))
    chunk_reads = [k for k in reads if re.search(r"/c(/\d+)+$", k)]
    q = "params/model.layers.1.self_attn.q_proj.weight/c/"
    assert [k.removeprefix(q) for k in chunk_reads if k.startswith(q)] == ["1/0"]
    o = "params/model.layers.0.self_attn.o_proj.weight/c/"
    assert [k.removeprefix(o) for k in chunk_reads if k.startswith(o)] == ["0/1"]
    # Every parameter has 1 or 2 chunks here; this shard reads exactly one of each of the 27,
    # except the embedding and lm_head: Vp = 256, rank 1's rows 128..256 are all padding (V=37).
    assert len(chunk_reads) == len(set(chunk_reads)) == len(model.param_shapes()) - 2
