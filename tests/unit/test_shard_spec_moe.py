"""Mixture-of-experts shard specs (pure): expert ranks as megatron-core 0.16.1 assigns them,
MoE shapes from a config, the megatron / hf / vllm expert layouts cut exactly, and the errors."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from flowrl.parallel.mesh import ParallelDims, validate_model_layout
from flowrl.parallel.shard_spec import ModelShape, model_shape, piece_index, shard_arrays, shard_spec

# 4 layers, 8 experts of width 8, qk norm (Qwen3-MoE-like), tied embeddings
SHAPE = ModelShape(vocab_size=61, hidden_size=8, ffn_hidden_size=32, num_layers=4, num_heads=4,
                   num_kv_heads=2, head_dim=2, tied_embeddings=True, num_experts=8,
                   experts_per_token=2, moe_ffn_hidden_size=8, qk_norm=True)


def _full(shape: ModelShape) -> dict[str, np.ndarray]:
    out, base = {}, 1.0  # distinct values everywhere
    for name, s in shape.param_shapes().items():
        n = math.prod(s)
        out[name] = (base + np.arange(n, dtype=np.float64)).reshape(s)
        base += n
    return out


def _layouts():
    for world, tp, pp, ep, etp in itertools.product([4, 8, 16], [1, 2, 4], [1, 2], [1, 2, 4, 8],
                                                     [None, 1, 2]):
        if world % (tp * pp) or world % ((tp if etp is None else etp) * ep * pp):
            continue
        yield world, tp, pp, ep, etp


def test_expert_ranks_are_megatron_cores():
    pytest.importorskip("megatron.core")
    from megatron.core.parallel_state import RankGenerator

    for world, tp, pp, ep, etp in _layouts():
        dims = ParallelDims.from_world_size(world, tp=tp, pp=pp, ep=ep, etp=etp)
        e = dims.expert_tp
        experts = RankGenerator(tp=e, ep=ep, dp=world // (e * ep * pp), pp=pp, cp=1,
                                order="tp-cp-ep-dp-pp")
        dense = RankGenerator(tp=tp, ep=1, dp=world // (tp * pp), pp=pp, cp=1,
                              order="tp-cp-ep-dp-pp")
        for axis, token in (("ep", "ep"), ("etp", "tp"), ("edp", "dp"), ("pp", "pp")):
            assert dims.axis_groups(axis) == sorted(experts.get_ranks(token)), (dims, axis)
        for axis in ("dp", "tp", "pp"):
            assert dims.axis_groups(axis) == sorted(dense.get_ranks(axis)), (dims, axis)
        # every shard key is held by num_replicas ranks; shard_rank inverts shard_key
        held: dict[tuple, list[int]] = {}
        for rank in range(world):
            key = dims.shard_key(rank)
            held.setdefault(key, []).append(rank)
            assert dims.shard_rank(key, dims.shard_replica(rank)) == rank
            edp, etp_rank, ep_rank, pp_rank = dims.expert_coords(rank)
            assert key == ((rank % tp, pp_rank) if not dims.expert_keys
                           else (rank % tp, pp_rank, ep_rank, etp_rank))
        assert all(len(r) == dims.num_replicas for r in held.values())
        assert dims.shard_keys() == list(held)


def test_dense_layouts_keep_their_keys():
    dims = ParallelDims(dp=2, tp=2, pp=2)
    assert not dims.expert_keys and dims.num_replicas == 2
    assert [dims.shard_key(r) for r in range(8)] == [(0, 0), (1, 0)] * 2 + [(0, 1), (1, 1)] * 2
    assert str(ParallelDims(dp=2, tp=2, pp=1, ep=4, etp=1)) == "dp=2,tp=2,pp=1,ep=4,etp=1"
    assert str(ParallelDims(dp=2, tp=2, pp=1, ep=2, etp=2)) == "dp=2,tp=2,pp=1,ep=2"


@pytest.mark.parametrize("kwargs, message", [
    ({"dp": 2, "tp": 2, "pp": 1, "ep": 0}, "expert_model_parallel_size=0"),
    ({"dp": 2, "tp": 2, "pp": 1, "etp": 0}, "expert_tensor_parallel_size=0"),
    ({"dp": 1, "tp": 2, "pp": 1, "ep": 2}, r"etp\*ep = 4 must divide .* 1\*2 = 2 .* use "
                                           r"expert_model_parallel_size 1"),
    ({"dp": 3, "tp": 1, "pp": 2, "ep": 2}, r"etp\*ep = 2 must divide .* 3\*1 = 3"),
])
def test_bad_expert_sizes_name_the_key(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ParallelDims(**kwargs)


def test_model_layout_checks_experts():
    kw = dict(num_attention_heads=4, num_key_value_heads=2, num_layers=2, vocab_size=64)
    with pytest.raises(ValueError, match=r"expert_model_parallel_size=4 does not divide the model's "
                                         r"num_experts=6.*use 1, 2, 3 or 6"):
        validate_model_layout(ParallelDims(dp=4, tp=1, pp=1, ep=4), num_experts=6, **kw)
    with pytest.raises(ValueError, match="a dense model"):
        validate_model_layout(ParallelDims(dp=2, tp=1, pp=1, ep=2), num_experts=0, **kw)
    validate_model_layout(ParallelDims(dp=2, tp=1, pp=1, ep=2), num_experts=4, **kw)
    with pytest.raises(ValueError, match="expert_tensor_parallel_size=3 does not divide the experts'"):
        shard_spec(SHAPE, ParallelDims(dp=3, tp=1, pp=1, etp=3))


def test_model_shape_from_qwen3_moe_and_mixtral_configs(tmp_path):
    qwen = {"model_type": "qwen3_moe", "vocab_size": 99, "hidden_size": 64, "intermediate_size": 256,
            "moe_intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8,
            "num_key_value_heads": 4, "head_dim": 8, "num_experts": 4, "num_experts_per_tok": 2,
            "tie_word_embeddings": True, "mlp_only_layers": [], "decoder_sparse_step": 1}
    (tmp_path / "config.json").write_text(json.dumps(qwen))
    shape = model_shape(str(tmp_path))
    assert (shape.num_experts, shape.experts_per_token, shape.moe_ffn_hidden_size, shape.qk_norm,
            shape.qkv_bias) == (4, 2, 64, True, False)
    params = shape.param_shapes()
    assert params["model.layers.1.mlp.gate.weight"] == (4, 64)
    assert params["model.layers.1.mlp.experts.3.gate_proj.weight"] == (64, 64)
    assert params["model.layers.1.mlp.experts.3.down_proj.weight"] == (64, 64)
    assert params["model.layers.0.self_attn.q_norm.weight"] == (8,)
    assert "model.layers.0.mlp.gate_proj.weight" not in params
    mixtral = {**qwen, "model_type": "mixtral", "num_local_experts": 4, "intermediate_size": 32}
    del mixtral["num_experts"], mixtral["moe_intermediate_size"]
    shape = model_shape(mixtral)
    assert (shape.num_experts, shape.moe_ffn_hidden_size, shape.qk_norm) == (4, 32, False)
    with pytest.raises(ValueError, match=r"mlp_only_layers=\[1\].*every layer is sparse"):
        model_shape({**qwen, "mlp_only_layers": [1]})
    with pytest.raises(ValueError, match="kv_lora_rank=512"):
        model_shape({**qwen, "kv_lora_rank": 512})
    # the presets: qwen3 MoE models map, deepseek-v3 (MLA) is refused by name
    assert model_shape("qwen3-30b-a3b").num_experts == 128
    with pytest.raises(ValueError, match="deepseek-v3"):
        model_shape("deepseek-v3")


def _covered_once(spec):
    """Every local element is written by at most one piece, and every logical element of every
    parameter lies in some shard."""
    seen = {p: np.zeros(s, dtype=np.int64) for p, s in spec.params.items()}
    for key, shard in spec.shards.items():
        marks = {n: np.zeros(s, dtype=np.int64) for n, s in shard.tensors.items()}
        for piece in shard.pieces:
            ndim = len(spec.params[piece.param])
            marks[piece.local][piece_index(piece, local=True, ndim=ndim)] += 1
            seen[piece.param][piece_index(piece, local=False, ndim=ndim)] += 1
        assert all(m.max(initial=0) <= 1 for m in marks.values()), key
    assert all(s.min() >= 1 for s in seen.values())


@pytest.mark.parametrize("style", ["megatron", "hf", "vllm"])
def test_every_expert_layout_covers_the_model(style):
    for world, tp, pp, ep, etp in _layouts():
        if SHAPE.num_heads % tp or SHAPE.num_experts % ep or SHAPE.moe_ffn_hidden_size % (etp or tp):
            continue
        dims = ParallelDims.from_world_size(world, tp=tp, pp=pp, ep=ep, etp=etp)
        if style == "vllm" and not ((ep == 1 and dims.expert_tp == tp) or
                                    (dims.expert_tp == 1 and ep % tp == 0)):
            with pytest.raises(ValueError, match="vLLM's FusedMoE"):
                shard_spec(SHAPE, dims, style=style, make_vocab_size_divisible_by=4)
            continue
        if style == "megatron" and ((SHAPE.num_heads + 2 * SHAPE.num_kv_heads) * SHAPE.head_dim) % tp:
            continue
        _covered_once(shard_spec(SHAPE, dims, style=style, make_vocab_size_divisible_by=4))


def test_megatron_experts_by_hand():
    # EP 2 x TP 2 on 4 ranks (dp 2): expert rank e holds experts [4e, 4e+4); each expert's fc1 is
    # [gate rows of etp rank; up rows], fc2 its columns; router and q/k norms whole.
    spec = shard_spec(SHAPE, ParallelDims(dp=2, tp=2, pp=1, ep=2), make_vocab_size_divisible_by=4)
    assert list(spec.shards) == [(0, 0, 0, 0), (1, 0, 0, 1), (0, 0, 1, 0), (1, 0, 1, 1)]
    assert spec.key_of(3) == (1, 0, 1, 1) and spec.dims.num_replicas == 1
    shard = spec.shards[(1, 0, 1, 1)]
    x = "decoder.layers.2.mlp.experts.local_experts.3."
    assert shard.tensors[x + "linear_fc1.weight"] == (8, 8)
    assert shard.tensors[x + "linear_fc2.weight"] == (8, 4)
    assert shard.tensors["decoder.layers.2.mlp.router.weight"] == (8, 8)
    assert shard.tensors["decoder.layers.2.self_attention.q_layernorm.weight"] == (2,)
    assert "decoder.layers.2.mlp.linear_fc1.weight" not in shard.tensors
    full = _full(SHAPE)
    local = shard_arrays(spec, full, (1, 0, 1, 1))
    e = "model.layers.2.mlp.experts.7."  # global expert 7 = 1 * 4 + 3
    assert np.array_equal(local[x + "linear_fc1.weight"],
                          np.concatenate([full[e + "gate_proj.weight"][4:], full[e + "up_proj.weight"][4:]]))
    assert np.array_equal(local[x + "linear_fc2.weight"], full[e + "down_proj.weight"][:, 4:])


@pytest.mark.parametrize("style, fc1, fc2", [("hf", "gate_up_proj", "down_proj"),
                                              ("vllm", "w13_weight", "w2_weight")])
def test_fused_experts_are_indexed_pieces(style, fc1, fc2):
    # tp 2, EP 1 (vLLM without expert parallelism: every expert split over tp)
    spec = shard_spec(SHAPE, ParallelDims(dp=1, tp=2, pp=1), style=style,
                      make_vocab_size_divisible_by=4)
    shard = spec.shards[(1, 0)]
    x = "model.layers.0.mlp.experts."
    assert shard.tensors[x + fc1] == (8, 8, 8) and shard.tensors[x + fc2] == (8, 8, 4)
    full = _full(SHAPE)
    local = shard_arrays(spec, full, (1, 0))
    for e in range(8):
        assert np.array_equal(local[x + fc1][e], np.concatenate(
            [full[f"{x}{e}.gate_proj.weight"][4:], full[f"{x}{e}.up_proj.weight"][4:]]))
        assert np.array_equal(local[x + fc2][e], full[f"{x}{e}.down_proj.weight"][:, 4:])
    # hf at tp 1: exactly transformers 5's fused in-memory tensors
    spec = shard_spec(SHAPE, ParallelDims(dp=1, tp=1, pp=1), style="hf")
    local = shard_arrays(spec, full, (0, 0))
    assert local[x + "gate_up_proj"].shape == (8, 16, 8)


def test_arch_spec_of_the_megatron_convert_maps_its_experts():
    import types

    moe = types.SimpleNamespace(num_experts=8, topk=2, ffn_hidden_size=8, norm_topk_prob=True)
    arch = types.SimpleNamespace(vocab_size=61, hidden_size=8, ffn_hidden_size=8, num_layers=4,
                                 num_heads=4, num_kv_heads=2, head_dim=2, qkv_bias=False,
                                 tied_embeddings=True, moe=moe, qk_norm=True)
    assert model_shape(arch).param_shapes() == SHAPE.param_shapes()


@pytest.mark.parametrize("dims", [ParallelDims(dp=2, tp=2, pp=1, ep=2),           # EP 2 x TP 2
                                  ParallelDims(dp=2, tp=2, pp=2, ep=2, etp=1),
                                  ParallelDims(dp=4, tp=1, pp=1, ep=4)])
def test_megatron_expert_shards_equal_convert(dims):
    # the training backend's own converter (per-expert HF names in) cuts exactly the spec's shards
    torch = pytest.importorskip("torch")
    from flowrl.backends.train.megatron.convert import hf_to_megatron
    from flowrl.models.char_tokenizer import build_char_tokenizer
    from flowrl.models.tiny import build_tiny_model, tiny_preset

    config = build_tiny_model(build_char_tokenizer(), **tiny_preset("moe")).config
    shape = model_shape(config)
    assert shape.num_experts == 4 and shape.qk_norm
    from flowrl.backends.train.megatron.convert import arch_spec

    assert model_shape(arch_spec(config)).param_shapes() == shape.param_shapes()
    rng = np.random.default_rng(0)
    full = {n: rng.standard_normal(s).astype(np.float32) for n, s in shape.param_shapes().items()}
    full_t = {n: torch.from_numpy(a) for n, a in full.items()}
    spec = shard_spec(shape, dims, make_vocab_size_divisible_by=8)
    for key, shard in spec.shards.items():
        ref = hf_to_megatron(full_t, config, tp_rank=shard.tp_rank, tp=dims.tp,
                             pp_rank=shard.pp_rank, pp=dims.pp, ep_rank=shard.ep_rank,
                             ep=dims.ep, etp_rank=key[3] if len(key) > 2 else shard.tp_rank,
                             etp=dims.expert_tp, make_vocab_size_divisible_by=8)
        mine = shard_arrays(spec, full, key)
        assert sorted(mine) == sorted(ref), key
        for name, x in ref.items():
            assert np.array_equal(mine[name], x.numpy()), (key, name)
