"""ParallelDims validates itself; rank order matches megatron-core; model layouts and their errors."""

import pytest

from flowrl.parallel.mesh import (
    RANK_ORDER,
    ParallelDims,
    balanced_stages,
    padded_vocab_size,
    valid_layouts,
    validate_model_layout,
)

# -- ParallelDims ---------------------------------------------------------------------------------


def test_world_size_and_model_parallel_size():
    dims = ParallelDims(dp=4, tp=2, pp=3)
    assert dims.world_size == 24
    assert dims.model_parallel_size == 6
    assert str(dims) == "dp=4,tp=2,pp=3"


@pytest.mark.parametrize(
    "kwargs, setting",
    [
        ({"dp": 0, "tp": 1, "pp": 1}, "data_parallel_size=0"),
        ({"dp": 1, "tp": -2, "pp": 1}, "tensor_model_parallel_size=-2"),
        ({"dp": 1, "tp": 1, "pp": 1.5}, "pipeline_model_parallel_size=1.5"),
        ({"dp": True, "tp": 1, "pp": 1}, "data_parallel_size=True"),
        ({"dp": 1, "tp": 1, "pp": 2, "vpp": 0}, "virtual_pipeline_model_parallel_size=0"),
    ],
)
def test_rejects_non_positive_sizes(kwargs, setting):
    with pytest.raises(ValueError, match=setting.replace("(", r"\(")):
        ParallelDims(**kwargs)


def test_vpp_needs_a_pipeline():
    message = "virtual_pipeline_model_parallel_size=2 needs pipeline_model_parallel_size > 1"
    with pytest.raises(ValueError, match=message):
        ParallelDims(dp=1, tp=1, pp=1, vpp=2)
    assert ParallelDims(dp=1, tp=1, pp=4, vpp=2).vpp == 2


def test_is_frozen_and_keyword_only():
    dims = ParallelDims(dp=1, tp=1, pp=1)
    with pytest.raises(AttributeError):
        dims.dp = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        ParallelDims(1, 1, 1)  # type: ignore[misc]


def test_from_world_size_derives_dp():
    assert ParallelDims.from_world_size(16, tp=4, pp=2) == ParallelDims(dp=2, tp=4, pp=2)
    with pytest.raises(ValueError, match=r"4\*3 = 12 does not divide the world size 16"):
        ParallelDims.from_world_size(16, tp=4, pp=3)


def test_check_world_size_names_settings_and_suggests_layouts():
    ParallelDims(dp=2, tp=2, pp=2).check_world_size(8)  # matches: no error
    with pytest.raises(ValueError) as info:
        ParallelDims(dp=2, tp=2, pp=2).check_world_size(4)
    message = str(info.value)
    for setting in ("data_parallel_size", "tensor_model_parallel_size", "pipeline_model_parallel_size"):
        assert setting in message
    assert "dp*tp*pp = 2*2*2 = 8 but the actor group has 4 workers" in message
    assert "set data_parallel_size=1 to keep tp=2, pp=2" in message
    # valid_layouts order: by pp, then tp (pure data parallel first)
    assert "valid layouts for 4: (dp=4,tp=1,pp=1), (2,2,1), (1,4,1), (2,1,2), (1,2,2), (1,1,4)" in message


def test_check_world_size_without_a_dp_fix_names_the_group():
    with pytest.raises(ValueError, match="the rollout group has 6 workers; pick one of the valid layouts for 6"):
        ParallelDims(dp=1, tp=4, pp=1).check_world_size(6, group="rollout")


# -- rank order -----------------------------------------------------------------------------------


def test_rank_order_is_megatrons_default():
    # megatron-core initialize_model_parallel(order="tp-cp-ep-dp-pp") with cp = ep = 1
    assert RANK_ORDER == "tp-dp-pp"
    dims = ParallelDims(dp=2, tp=2, pp=2)
    # rank = tp_rank + tp * (dp_rank + dp * pp_rank): rank 5 = 1 + 2 * (0 + 2 * 1)
    assert dims.rank_coords(5) == (0, 1, 1)
    assert dims.rank_coords(2) == (1, 0, 0)
    assert dims.rank_coords(7) == (1, 1, 1)
    # The groups megatron-core 0.16.1's RankGenerator(tp=2, dp=2, pp=2, order="tp-cp-ep-dp-pp") builds.
    assert dims.axis_groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert dims.axis_groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert dims.axis_groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]


@pytest.mark.parametrize("dp, tp, pp", [(1, 1, 1), (3, 4, 2), (2, 8, 4), (5, 1, 3)])
def test_rank_coords_round_trip(dp, tp, pp):
    dims = ParallelDims(dp=dp, tp=tp, pp=pp)
    seen = set()
    for rank in range(dims.world_size):
        coords = dims.rank_coords(rank)
        assert dims.coords_rank(*coords) == rank
        seen.add(coords)
    assert len(seen) == dims.world_size
    for axis, size in (("dp", dp), ("tp", tp), ("pp", pp)):
        groups = dims.axis_groups(axis)
        assert len(groups) == dims.world_size // size and all(len(g) == size for g in groups)
        assert sorted(r for g in groups for r in g) == list(range(dims.world_size))


def test_rank_coords_rejects_out_of_range():
    dims = ParallelDims(dp=2, tp=2, pp=1)
    with pytest.raises(ValueError, match=r"rank=4 must be an integer in \[0, 4\)"):
        dims.rank_coords(4)
    with pytest.raises(ValueError, match=r"tp_rank=2 must be an integer in \[0, 2\)"):
        dims.coords_rank(0, 2, 0)
    with pytest.raises(ValueError, match="axis='cp' is not a mesh axis"):
        dims.axis_groups("cp")  # type: ignore[arg-type]


# -- model layouts --------------------------------------------------------------------------------

LLAMA3_8B = {"num_attention_heads": 32, "num_key_value_heads": 8, "num_layers": 32, "vocab_size": 128256}


def test_llama3_8b_on_tp4_pp2():
    layout = validate_model_layout(ParallelDims(dp=1, tp=4, pp=2), **LLAMA3_8B)
    assert layout.heads_per_rank == 8
    assert layout.kv_heads_per_rank == 2
    assert layout.kv_replicas == 1
    assert layout.layers_per_stage == (16, 16)
    assert layout.layers_per_chunk is None
    # 128256 rounded up to a multiple of 128 * 4 = 512: 250.5 -> 251 * 512 = 128512
    assert layout.padded_vocab_size == 128512
    assert layout.vocab_per_rank == 128512 // 4


def test_padded_vocab_size_is_megatrons_rule():
    assert padded_vocab_size(32000, 1) == 32000  # 250 * 128
    assert padded_vocab_size(32000, 8) == 32768  # multiple of 1024: 31.25 -> 32 * 1024
    assert padded_vocab_size(151936, 2, make_vocab_size_divisible_by=64) == 151936  # 1187 * 128


def test_kv_heads_fewer_than_tp_are_replicated():
    # 32 query heads, 8 kv heads, tp=16: each kv head lives on 2 ranks (megatron-core allows it)
    layout = validate_model_layout(ParallelDims(dp=1, tp=16, pp=1), **LLAMA3_8B)
    assert (layout.heads_per_rank, layout.kv_heads_per_rank, layout.kv_replicas) == (2, 1, 2)


def test_tp_not_dividing_heads_names_setting_value_and_choices():
    with pytest.raises(ValueError) as info:
        validate_model_layout(ParallelDims(dp=1, tp=3, pp=1), num_attention_heads=8, num_key_value_heads=8,
                              num_layers=4, vocab_size=100)
    assert str(info.value) == (
        "tensor_model_parallel_size=3 does not divide num_attention_heads=8; use 1, 2, 4 or 8"
    )


def test_tp_and_kv_heads_must_divide_one_another():
    # 12 heads, 4 kv heads: tp=6 splits the heads but neither divides the other with 4
    match = r"tensor_model_parallel_size=6 and num_key_value_heads=4 .*use 1, 2, 4 or 12"
    with pytest.raises(ValueError, match=match):
        validate_model_layout(ParallelDims(dp=1, tp=6, pp=1), num_attention_heads=12, num_key_value_heads=4,
                              num_layers=4, vocab_size=100)


def test_kv_heads_must_divide_heads():
    with pytest.raises(ValueError, match="num_key_value_heads=3 must divide num_attention_heads=8"):
        validate_model_layout(ParallelDims(dp=1, tp=1, pp=1), num_attention_heads=8, num_key_value_heads=3,
                              num_layers=4, vocab_size=100)


def test_pp_not_dividing_layers_suggests_divisors_and_an_uneven_split():
    with pytest.raises(ValueError) as info:
        validate_model_layout(ParallelDims(dp=1, tp=1, pp=3), **LLAMA3_8B)
    assert str(info.value) == (
        "pipeline_model_parallel_size=3 does not divide num_layers=32; use 1, 2, 4, 8, 16 or 32, "
        "or give layers_per_stage=[11, 11, 10]"
    )


def test_uneven_layers_per_stage():
    # Llama-3.1-405B's 126 layers on 16 stages: the end stages, which also hold the embedding and
    # the output layer, get 7 layers, the 14 middle ones 8 (7*2 + 8*14 = 126).
    stages = balanced_stages(126, 16)
    assert stages == [7] + [8] * 14 + [7]
    layout = validate_model_layout(ParallelDims(dp=1, tp=8, pp=16), num_attention_heads=128,
                                   num_key_value_heads=8, num_layers=126, vocab_size=128256,
                                   layers_per_stage=stages)
    assert layout.layers_per_stage == tuple(stages)


@pytest.mark.parametrize(
    "stages, match",
    [
        ([16, 15], "sums to 31 but num_layers=32"),
        ([32, 0], "every stage needs a whole number >= 1"),
        ([10, 10, 12], "has 3 entries but pipeline_model_parallel_size=2"),
    ],
)
def test_bad_layers_per_stage(stages, match):
    with pytest.raises(ValueError, match=match):
        validate_model_layout(ParallelDims(dp=1, tp=1, pp=2), **LLAMA3_8B, layers_per_stage=stages)


def test_pp_beyond_layers():
    with pytest.raises(ValueError, match="pipeline_model_parallel_size=64 exceeds num_layers=32"):
        validate_model_layout(ParallelDims(dp=1, tp=1, pp=64), **LLAMA3_8B)


def test_virtual_pipeline_needs_layers_divisible_by_pp_times_vpp():
    layout = validate_model_layout(ParallelDims(dp=1, tp=1, pp=4, vpp=2), **LLAMA3_8B)
    assert layout.layers_per_chunk == 4  # 32 / (4 * 2)
    match = r"32 % \(4\*3\) != 0; use virtual_pipeline_model_parallel_size 2, 4 or 8"
    with pytest.raises(ValueError, match=match):
        validate_model_layout(ParallelDims(dp=1, tp=1, pp=4, vpp=3), **LLAMA3_8B)


def test_valid_layouts_filters_by_model():
    assert len(valid_layouts(8)) == 10  # (pp, tp) pairs with pp * tp | 8
    layouts = valid_layouts(8, num_attention_heads=12, num_key_value_heads=4, num_layers=2)
    expected = {(8, 1, 1), (4, 2, 1), (2, 4, 1), (4, 1, 2), (2, 2, 2), (1, 4, 2)}  # tp | 12, kv rule, pp | 2
    assert {(d.dp, d.tp, d.pp) for d in layouts} == expected
    assert all(d.world_size == 8 for d in layouts)
    with pytest.raises(ValueError, match="world_size=0 must be a positive integer"):
        valid_layouts(0)
