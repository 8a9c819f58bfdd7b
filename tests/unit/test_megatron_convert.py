"""HF <-> megatron shard adapter: exact round trips and the layout of individual shards (pure)."""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from flowrl.backends.train.megatron.convert import chunk_layers, hf_to_megatron, megatron_to_hf

transformers = pytest.importorskip("transformers")


@functools.lru_cache(maxsize=None)
def _tiny(kind: str, *, tied: bool, vocab: int = 61):
    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[kind]
    config = cls(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)
    model = transformers.AutoModelForCausalLM.from_config(config)
    g = torch.Generator().manual_seed(0)
    state = {k: torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()}
    if tied:
        state.pop("lm_head.weight", None)
    return config, state


def _shards(state, config, *, tp, pp, vpp, divisible_by):
    return {(t, p, v): hf_to_megatron(state, config, tp_rank=t, tp=tp, pp_rank=p, pp=pp,
                                      vpp_rank=v, vpp=vpp,
                                      make_vocab_size_divisible_by=divisible_by)
            for t in range(tp) for p in range(pp) for v in (range(vpp) if vpp else [None])}


# (tp, pp, vpp); tp=4 > 2 kv heads: each KV group spans two tp ranks
LAYOUTS = [(1, 1, None), (2, 1, None), (1, 2, None), (2, 2, None), (1, 4, None), (1, 2, 2),
           (2, 2, 2), (4, 1, None), (4, 2, 2)]


@pytest.mark.parametrize("kind,tied", [("llama", False), ("qwen2", True), ("qwen2", False)])
@pytest.mark.parametrize("tp,pp,vpp", LAYOUTS)
@pytest.mark.parametrize("divisible_by", [1, 128])
def test_round_trip_is_exact(kind, tied, tp, pp, vpp, divisible_by):
    config, state = _tiny(kind, tied=tied)
    shards = _shards(state, config, tp=tp, pp=pp, vpp=vpp, divisible_by=divisible_by)
    back = megatron_to_hf(shards, config, tp=tp, pp=pp, vpp=vpp)
    assert set(back) == set(state)
    for name, tensor in state.items():
        assert torch.equal(back[name], tensor), name


def test_chunk_layers_interleaved_assignment():
    # 8 layers, pp=2, vpp=2: chunk v of stage p starts at v * 4 + p * 2
    assert [list(chunk_layers(8, pp_rank=p, pp=2, vpp_rank=v, vpp=2))
            for v in range(2) for p in range(2)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert list(chunk_layers(4, pp_rank=1, pp=2)) == [2, 3]
    with pytest.raises(ValueError, match="divisible"):
        chunk_layers(4, pp_rank=0, pp=3)


def test_shard_layout_tp2():
    config, state = _tiny("qwen2", tied=False)
    s0, s1 = (hf_to_megatron(state, config, tp_rank=r, tp=2, pp_rank=0, pp=1,
                             make_vocab_size_divisible_by=8) for r in range(2))
    d, h = 8, 32  # head_dim, hidden
    q, k, v = (state[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv")
    # 4 query heads, 2 KV groups: tp rank r holds group r as [q head 2r, q head 2r+1, k_r, v_r]
    qkv1 = s1["decoder.layers.0.self_attention.linear_qkv.weight"]
    assert qkv1.shape == (4 * d, h)
    assert torch.equal(qkv1[: 2 * d], q[2 * d:4 * d])
    assert torch.equal(qkv1[2 * d:3 * d], k[d:2 * d])
    assert torch.equal(qkv1[3 * d:], v[d:2 * d])
    bias0 = s0["decoder.layers.0.self_attention.linear_qkv.bias"]
    assert torch.equal(bias0[2 * d:3 * d], state["model.layers.0.self_attn.k_proj.bias"][:d])
    # fc1 on rank r is [gate rows of r; up rows of r]
    gate, up = (state[f"model.layers.0.mlp.{p}_proj.weight"] for p in ("gate", "up"))
    fc1 = s1["decoder.layers.0.mlp.linear_fc1.weight"]
    assert torch.equal(fc1[:32], gate[32:]) and torch.equal(fc1[32:], up[32:])
    # row-parallel: o_proj / down_proj split along dim 1
    assert torch.equal(s1["decoder.layers.0.self_attention.linear_proj.weight"],
                       state["model.layers.0.self_attn.o_proj.weight"][:, 16:])
    # vocabulary 61 padded to 64: rank 1 holds rows 32..60 and three zero rows
    emb1 = s1["embedding.word_embeddings.weight"]
    assert emb1.shape == (32, h)
    assert torch.equal(emb1[:29], state["model.embed_tokens.weight"][32:])
    assert not emb1[29:].any()


def test_kv_heads_fewer_than_tp_split_groups_across_ranks():
    config, state = _tiny("llama", tied=False)
    d = 8
    q, k, v = (state[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv")
    # tp=4, 2 KV groups [q0 q1 k0 v0 | q2 q3 k1 v1]: rank 1 holds k0, v0; rank 2 holds q2, q3
    r1, r2 = (hf_to_megatron(state, config, tp_rank=r, tp=4, pp_rank=0, pp=1)
              ["decoder.layers.0.self_attention.linear_qkv.weight"] for r in (1, 2))
    assert torch.equal(r1, torch.cat([k[:d], v[:d]]))
    assert torch.equal(r2, q[2 * d:4 * d])


def test_stage_contents_and_tied_copy():
    config, state = _tiny("qwen2", tied=True)
    first, last = (hf_to_megatron(state, config, tp_rank=0, tp=1, pp_rank=p, pp=2)
                   for p in range(2))
    assert "embedding.word_embeddings.weight" in first and "output_layer.weight" not in first
    # layer indices restart at 0 on each stage; the last stage holds a copy of the embedding
    assert torch.equal(last["decoder.layers.0.input_layernorm.weight"],
                       state["model.layers.2.input_layernorm.weight"])
    assert "decoder.layers.2.input_layernorm.weight" not in last
    assert torch.equal(last["output_layer.weight"][:61], state["model.embed_tokens.weight"])
    only = hf_to_megatron(state, config, tp_rank=0, tp=1, pp_rank=0, pp=1)
    assert "output_layer.weight" not in only  # tied, one stage: GPTModel reuses the embedding


def test_rejects_unsupported_configs():
    config, state = _tiny("llama", tied=False)
    config = copy.deepcopy(config)
    config.hidden_act = "gelu"
    with pytest.raises(ValueError, match="hidden_act"):
        hf_to_megatron(state, config, tp_rank=0, tp=1, pp_rank=0, pp=1)


@pytest.mark.parametrize("kind,tied", [("llama", False), ("qwen2", True)])
@pytest.mark.parametrize("tp,pp,vpp", [(2, 2, None), (4, 2, 2), (1, 4, None)])
def test_shards_read_from_safetensors_slices_equal_the_whole_loads(tmp_path, kind, tied, tp, pp, vpp):
    """A rank reads its chunk straight from the checkpoint's files (two files and an index here):
    the same tensors, bitwise, as converting the whole state; only its stage's layers are touched,
    and of a column-parallel weight only its rows."""
    import json

    from safetensors.torch import save_file

    from flowrl.backends.train.tensor_source import safetensors_source

    config, state = _tiny(kind, tied=tied)
    names = sorted(state)
    halves = {"a.safetensors": names[::2], "b.safetensors": names[1::2]}
    for file, part in halves.items():
        save_file({n: state[n].contiguous() for n in part}, str(tmp_path / file))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {n: f for f, part in halves.items() for n in part}}))
    for key, expected in _shards(state, config, tp=tp, pp=pp, vpp=vpp, divisible_by=128).items():
        t, p, v = key
        with safetensors_source(str(tmp_path)) as source:
            got = hf_to_megatron(source, config, tp_rank=t, tp=tp, pp_rank=p, pp=pp, vpp_rank=v, vpp=vpp)
            reads = list(source.reads)
        assert got.keys() == expected.keys()
        for name in expected:
            assert torch.equal(got[name], expected[name]), (key, name)
        stage = set(chunk_layers(4, pp_rank=p, pp=pp, vpp_rank=v, vpp=vpp))
        touched = {int(n.split(".")[2]) for n, _, _ in reads if n.startswith("model.layers.")}
        assert touched == stage, (key, touched)  # never another stage's layers
        gate = [r for n, r, _ in reads if n.endswith(f"layers.{min(stage)}.mlp.gate_proj.weight")]
        assert gate == [(64 // tp * t, 64 // tp * (t + 1))], gate  # its rows only
        assert all(r is not None or c is not None or not n.endswith(("proj.weight", "embed_tokens.weight"))
                   for n, r, c in reads)  # no tensor-parallel weight read whole


def test_a_missing_tensor_is_a_key_error_naming_it(tmp_path):
    from safetensors.torch import save_file

    from flowrl.backends.train.tensor_source import safetensors_source

    config, state = _tiny("llama", tied=False)
    save_file({n: t for n, t in state.items() if n != "model.norm.weight"}, str(tmp_path / "model.safetensors"))
    with safetensors_source(str(tmp_path)) as source, pytest.raises(KeyError, match="model.norm.weight"):
        hf_to_megatron(source, config, tp_rank=0, tp=1, pp_rank=0, pp=1)
