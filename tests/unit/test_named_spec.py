"""Layouts of whole parameters for a model known by its names alone (flowrl.parallel.named_spec):
pure, no torch."""

import numpy as np
import pytest

from flowrl.parallel.mesh import ParallelDims
from flowrl.parallel.model_shape import ModelShape, NamedShape, model_shape
from flowrl.parallel.named_spec import named_shard_spec, spec_for
from flowrl.parallel.reshard_plan import Placement, plan_reshard
from flowrl.parallel.shard_spec import shard_arrays

SHAPES = {"model.visual.patch_embed.proj.weight": (4, 3, 2, 2, 2), "model.visual.blocks.0.norm1.weight": (4,),
          "model.language_model.embed_tokens.weight": (10, 6), "model.language_model.norm.weight": (6,)}


def test_named_shape_keeps_names_and_refuses_what_no_layout_holds():
    model = NamedShape.from_shapes(SHAPES, model_type="qwen2_vl")
    assert model.param_shapes() == SHAPES and model.vocab_size == 10 and not model.is_moe
    assert model_shape(model) is model and hash(model) == hash(NamedShape.from_shapes(SHAPES, model_type="qwen2_vl"))
    with pytest.raises(ValueError, match="scale has shape"):
        NamedShape.from_shapes({**SHAPES, "scale": ()}, model_type="x")
    with pytest.raises(ValueError, match="no parameters"):
        NamedShape.from_shapes({}, model_type="x")


def test_every_rank_holds_every_parameter_whole_and_a_split_plan_moves_the_model_once_per_replica():
    model = NamedShape.from_shapes(SHAPES, model_type="qwen2_vl")
    src = named_shard_spec(model, ParallelDims(dp=2, tp=1, pp=1))
    dst = spec_for(model, ParallelDims(dp=3, tp=1, pp=1), style="hf")
    assert list(src.shards) == list(dst.shards) == [(0, 0)]
    rng = np.random.default_rng(0)
    full = {n: rng.normal(size=s).astype(np.float32) for n, s in SHAPES.items()}
    local = shard_arrays(dst, full, (0, 0))
    assert all(np.array_equal(local[n], full[n]) for n in SHAPES)
    plan = plan_reshard(src, dst, placement=Placement.split(2, 3), bytes_per_element=4)
    # each of the 3 generation ranks receives the whole model (numel 96 + 4 + 60 + 6 = 166) once
    assert sum(t.nbytes for t in plan.transfers) == 3 * 166 * 4


def test_spec_for_gives_a_model_shape_the_named_layouts():
    text = ModelShape(vocab_size=16, hidden_size=8, ffn_hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                      head_dim=4)
    assert "model.layers.0.self_attn.q_proj.weight" in spec_for(text, ParallelDims(dp=1, tp=1, pp=1), style="hf").params


def test_vllm_staging_layout_whole_at_tp1_and_rows_over_tp_ranks_reassembled_whole():
    model = NamedShape.from_shapes(SHAPES, model_type="qwen2_vl")
    one = named_shard_spec(model, ParallelDims(dp=1, tp=1, pp=1), style="vllm")
    assert one.shard_of(0).tensors == SHAPES and one.style == "vllm"
    two = named_shard_spec(model, ParallelDims(dp=2, tp=3, pp=1), style="vllm")
    assert list(two.shards) == [(0, 0), (1, 0), (2, 0)]
    # rows [r n / 3, (r + 1) n / 3): the patch embedding's 4 rows as 1 / 1 / 2, the norm's 4 likewise
    assert [two.shards[(r, 0)].tensors["model.visual.patch_embed.proj.weight"] for r in range(3)] == \
        [(1, 3, 2, 2, 2), (1, 3, 2, 2, 2), (2, 3, 2, 2, 2)]
    assert [two.shards[(r, 0)].tensors["model.language_model.embed_tokens.weight"] for r in range(3)] == \
        [(3, 6), (3, 6), (4, 6)]
    tiny = NamedShape.from_shapes({"a": (2, 3), "b": (5,)}, model_type="x")
    sparse = named_shard_spec(tiny, ParallelDims(dp=1, tp=3, pp=1), style="vllm")
    assert "a" not in sparse.shards[(0, 0)].tensors and sparse.shards[(1, 0)].tensors["a"] == (1, 3)
    rng = np.random.default_rng(0)
    full = {n: rng.normal(size=s).astype(np.float32) for n, s in SHAPES.items()}
    src = named_shard_spec(model, ParallelDims(dp=2, tp=1, pp=1))
    plan = plan_reshard(src, two, placement=Placement.split(2, 6), bytes_per_element=4)
    assert sum(t.nbytes for t in plan.transfers) == 2 * 166 * 4  # each replica's 3 ranks get the model once
    for name, value in full.items():  # the engine rank's assembly: the three ranks' rows in order
        rows = [shard_arrays(two, full, (t, 0))[name] for t in range(3) if name in two.shards[(t, 0)].tensors]
        assert np.array_equal(np.concatenate(rows), value), name
    with pytest.raises(ValueError, match="pp=2 would split them"):
        named_shard_spec(model, ParallelDims(dp=1, tp=1, pp=2), style="vllm")
