"""Shard specs: megatron shards equal convert.hf_to_megatron's; vLLM-style layout details (pure)."""

from __future__ import annotations

import types

import numpy as np
import pytest

from flowrl.parallel.mesh import ParallelDims
from flowrl.parallel.shard_spec import ModelShape, model_shape, shard_arrays, shard_spec


def _config(kind: str, *, tied: bool, vocab: int = 61, kv: int = 2):
    return types.SimpleNamespace(
        model_type=kind, vocab_size=vocab, hidden_size=32, intermediate_size=64,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=kv,
        tie_word_embeddings=tied, rms_norm_eps=1e-6, max_position_embeddings=64, hidden_act="silu")


def _full(shape: ModelShape, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shape.param_shapes().items()}


# (tp, pp, vpp); tp=4 > 2 kv heads: a KV group spans two tp ranks
LAYOUTS = [(1, 1, None), (2, 1, None), (2, 2, None), (1, 4, None), (2, 2, 2), (4, 1, None),
           (4, 2, 2)]


@pytest.mark.parametrize("kind,tied", [("llama", False), ("qwen2", True)])
def test_megatron_spec_matches_convert(kind, tied):
    torch = pytest.importorskip("torch")
    from flowrl.backends.train.megatron.convert import hf_to_megatron

    config = _config(kind, tied=tied)
    shape = model_shape(config)
    assert shape.qkv_bias == (kind == "qwen2") and shape.tied_embeddings == tied
    full = _full(shape)
    full_t = {k: torch.from_numpy(v) for k, v in full.items()}
    for tp, pp, vpp in LAYOUTS:
        spec = shard_spec(shape, ParallelDims(dp=1, tp=tp, pp=pp, vpp=vpp),
                          make_vocab_size_divisible_by=8)
        for (t, p) in spec.shards:
            mine = shard_arrays(spec, full, (t, p))
            ref = {}
            for v in range(vpp) if vpp else [None]:
                prefix = f"model{v}." if vpp and vpp > 1 else ""
                chunk = hf_to_megatron(full_t, config, tp_rank=t, tp=tp, pp_rank=p, pp=pp,
                                       vpp_rank=v, vpp=vpp, make_vocab_size_divisible_by=8)
                ref.update({prefix + k: x.numpy() for k, x in chunk.items()})
            assert sorted(mine) == sorted(ref), (tp, pp, vpp, t, p)
            for name, x in ref.items():
                assert np.array_equal(mine[name], x), (tp, pp, vpp, t, p, name)


def test_vllm_qkv_replicates_kv_heads_when_tp_exceeds_them():
    # 4 query heads, 1 kv head, head_dim 8, tp 2: rank r holds q heads [2r, 2r+2) and the one kv
    # head: qkv_proj rows = [q 16 rows; k 8; v 8] = 32 on both ranks.
    shape = ModelShape(vocab_size=64, hidden_size=32, ffn_hidden_size=64, num_layers=1,
                       num_heads=4, num_kv_heads=1, head_dim=8)
    spec = shard_spec(shape, ParallelDims(dp=1, tp=2, pp=1), style="vllm")
    for r in range(2):
        shard = spec.shards[(r, 0)]
        assert shard.tensors["model.layers.0.self_attn.qkv_proj.weight"] == (32, 32)
        pieces = {p.param.split(".")[-2]: (p.start, p.stop, p.offset) for p in shard.pieces
                  if "qkv" in p.local}
        assert pieces == {"q_proj": (16 * r, 16 * r + 16, 0), "k_proj": (0, 8, 16),
                          "v_proj": (0, 8, 24)}


def test_megatron_qkv_interleaves_per_group():
    # 4 heads, 2 kv groups, d=8, tp=2: rank r holds group r = [q heads 2r,2r+1 (16 rows); k_r; v_r].
    shape = ModelShape(vocab_size=64, hidden_size=32, ffn_hidden_size=64, num_layers=1,
                       num_heads=4, num_kv_heads=2, head_dim=8)
    spec = shard_spec(shape, ParallelDims(dp=1, tp=2, pp=1))
    got = [(p.param.split(".")[-2], p.start, p.stop, p.offset) for p in spec.shards[(1, 0)].pieces
           if "linear_qkv" in p.local]
    assert got == [("q_proj", 16, 32, 0), ("k_proj", 8, 16, 16), ("v_proj", 8, 16, 24)]


def test_vocab_padding_rows_map_to_nothing():
    # V=61, megatron tp=2 pads to 64 (divisible_by 16 * tp 2 = 32): rank 1 rows [32, 61) + 3 pad.
    shape = ModelShape(vocab_size=61, hidden_size=8, ffn_hidden_size=8, num_layers=1,
                       num_heads=2, num_kv_heads=2, head_dim=4, tied_embeddings=True)
    spec = shard_spec(shape, ParallelDims(dp=1, tp=2, pp=1),
                      make_vocab_size_divisible_by=16)
    assert spec.padded_vocab_size == 64
    emb = [p for p in spec.shards[(1, 0)].pieces if p.param == "model.embed_tokens.weight"]
    assert [(p.start, p.stop, p.offset) for p in emb] == [(32, 61, 0)]
    assert spec.shards[(1, 0)].tensors["embedding.word_embeddings.weight"] == (32, 8)
    vllm = shard_spec(shape, ParallelDims(dp=1, tp=2, pp=1), style="vllm")
    assert vllm.padded_vocab_size == 64  # multiple of 64


def test_tied_embeddings_pp_last_stage_holds_a_copy():
    shape = ModelShape(vocab_size=64, hidden_size=8, ffn_hidden_size=8, num_layers=2,
                       num_heads=2, num_kv_heads=2, head_dim=4, tied_embeddings=True)
    for style, local in (("megatron", "output_layer.weight"), ("vllm", "model.embed_tokens.weight")):
        spec = shard_spec(shape, ParallelDims(dp=1, tp=1, pp=2), style=style)
        last = [p for p in spec.shards[(0, 1)].pieces if p.param == "model.embed_tokens.weight"]
        assert [(p.local, p.start, p.stop) for p in last] == [(local, 0, 64)]
        assert "lm_head.weight" not in spec.params


def test_bad_layouts_name_the_setting():
    shape = ModelShape(vocab_size=64, hidden_size=8, ffn_hidden_size=12, num_layers=2,
                       num_heads=6, num_kv_heads=2, head_dim=4)
    with pytest.raises(ValueError, match="tensor_model_parallel_size=4 does not divide "
                                         "num_attention_heads=6"):
        shard_spec(shape, ParallelDims(dp=1, tp=4, pp=1))
    with pytest.raises(ValueError, match="pipeline_model_parallel_size=4 exceeds num_layers=2"):
        shard_spec(shape, ParallelDims(dp=1, tp=1, pp=4), style="vllm")
    with pytest.raises(ValueError, match="style='sglang'"):
        shard_spec(shape, ParallelDims(dp=1, tp=1, pp=1), style="sglang")
    with pytest.raises(ValueError, match="intermediate_size=12"):
        shard_spec(ModelShape(vocab_size=64, hidden_size=8, ffn_hidden_size=12, num_layers=2,
                              num_heads=8, num_kv_heads=8, head_dim=4),
                   ParallelDims(dp=1, tp=8, pp=1))


def test_model_shape_from_preset_and_dict():
    seven = model_shape("7B")
    assert (seven.num_layers, seven.hidden_size, seven.vocab_size) == (32, 4096, 32000)
    qwen = model_shape({"model_type": "qwen2", "vocab_size": 100, "hidden_size": 16,
                        "intermediate_size": 32, "num_hidden_layers": 2,
                        "num_attention_heads": 4, "num_key_value_heads": 2})
    assert qwen.qkv_bias and qwen.head_dim == 4 and not qwen.tied_embeddings
