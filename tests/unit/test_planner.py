"""The parallelism planner: model shapes, memory sanity, the recommendations practice documents,
every bad-input error, and the ``flowrl parallel-plan`` entry point."""

import argparse
import json

import pytest

from flowrl.parallel import plan_cli
from flowrl.parallel.layout_cost import INTERCONNECTS, TIE_TOLERANCE
from flowrl.parallel.layout_search import format_plan, plan_parallelism
from flowrl.parallel.model_spec import ModelSpec, parse_model

# -- model shapes ---------------------------------------------------------------------------------


def test_standard_shapes_from_parameter_counts():
    llama2_7b = parse_model("7B")
    assert llama2_7b.name == "llama-2-7b"
    assert llama2_7b.num_params == 6_738_415_616  # the count the Llama-2-7B checkpoint reports
    assert parse_model(7e9) == parse_model("7b") == parse_model("7000M") == llama2_7b
    assert parse_model("8B").num_params == 8_030_261_248  # Llama-3-8B
    assert parse_model("70B").name == "llama-3-70b"
    assert parse_model("405B").num_layers == 126


@pytest.mark.parametrize("count", [2e9, 20e9, 175e9, 1e12])
def test_interpolated_shapes_match_the_count(count):
    spec = parse_model(count)
    assert spec.name.startswith("interpolated-")
    assert abs(spec.num_params / count - 1) < 0.1
    assert spec.num_attention_heads * 128 == spec.hidden_size
    assert spec.num_layers % 4 == 0


def test_from_hf_config_dict_file_and_directory(tmp_path):
    config = {
        "model_type": "qwen2", "num_hidden_layers": 28, "hidden_size": 3584, "num_attention_heads": 28,
        "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 152064, "hidden_act": "silu",
        "tie_word_embeddings": False,
    }
    spec = ModelSpec.from_hf_config(config)
    assert (spec.name, spec.num_layers, spec.num_key_value_heads, spec.dh) == ("qwen2", 28, 4, 128)
    assert spec.gated_mlp
    assert 7.0e9 < spec.num_params < 7.7e9  # Qwen2.5-7B: 7.6B with q/k/v biases, which we do not count
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert parse_model(str(tmp_path)) == spec
    assert parse_model(tmp_path / "config.json") == spec
    gpt2 = ModelSpec.from_hf_config({"n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257,
                                     "activation_function": "gelu_new"})
    assert (gpt2.ffn_hidden_size, gpt2.gated_mlp, gpt2.num_key_value_heads) == (3072, False, 12)


@pytest.mark.parametrize(
    "model, match",
    [
        ("7Q", "neither a parameter count"),
        ("12345", "under 10M"),
        ("/no/such/dir", "neither a parameter count"),
        ({"hidden_size": 64}, "none of the keys"),
    ],
)
def test_bad_models(model, match):
    with pytest.raises(ValueError, match=match):
        parse_model(model)


def test_model_spec_validates_itself():
    with pytest.raises(ValueError, match="ModelSpec.num_layers=0"):
        ModelSpec(num_layers=0, hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                  ffn_hidden_size=128, vocab_size=100)
    with pytest.raises(ValueError, match="num_key_value_heads=3 must divide num_attention_heads=4"):
        ModelSpec(num_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=3,
                  ffn_hidden_size=128, vocab_size=100)


# -- memory sanity --------------------------------------------------------------------------------


def test_7b_weight_memory_is_14gb_over_tp_times_pp():
    entries = plan_parallelism("7B", num_gpus=8, top_k=None)
    assert len(entries) > 3
    for e in entries:
        sharded = 13.48 / (e.dims.tp * e.dims.pp)  # 6.74e9 params * 2 bytes = 13.5 GB
        # The fullest stage also holds an embedding (0.13B params), hence a few percent more.
        assert sharded * 0.999 <= e.weights_gb <= sharded * 1.12
        assert e.grads_gb == pytest.approx(2 * e.weights_gb)  # fp32 main_grad
        assert e.reference_gb == pytest.approx(e.weights_gb)  # colocated bf16 reference policy
        # Adam's 12 bytes/param sharded over all dp*tp*pp ranks: 12 * 6.74e9 / 8 = 10.1 GB
        assert e.optimizer_gb == pytest.approx(10.1, rel=0.12)
        assert e.memory_gb <= e.memory_limit_gb == 72.0


def test_distributed_optimizer_and_reference_model_switches():
    base = plan_parallelism("7B", num_gpus=16, tp=2, pp=1)[0]
    plain = plan_parallelism("7B", num_gpus=16, tp=2, pp=1, distributed_optimizer=False,
                             reference_model=False, gpu_memory_gb=141)[0]
    assert plain.optimizer_gb == pytest.approx(base.optimizer_gb * base.dims.dp)  # not sharded over dp=8
    assert plain.reference_gb == 0.0


def test_pipeline_does_not_shrink_first_stage_activations_but_tp_does():
    # 1F1B keeps pp micro-batches in flight on the first stage, each of num_layers/pp layers.
    entries = plan_parallelism("8B", num_gpus=16, top_k=None, recompute="none")
    by_layout = {(e.dims.tp, e.dims.pp): e for e in entries}
    tp2_pp1, tp2_pp2, tp4_pp1 = by_layout[2, 1], by_layout[2, 2], by_layout[4, 1]
    logits = 6 * 4096 * 128256 / 2 / 1e9  # last-stage logits at tp=2, counted only when pp=1 here
    assert tp2_pp2.activations_gb == pytest.approx(tp2_pp1.activations_gb - logits, rel=0.02)
    assert tp4_pp1.activations_gb == pytest.approx(tp2_pp1.activations_gb / 2, rel=0.02)


def test_recompute_only_when_needed():
    # 405B on 256 GPUs: tp=8, pp=16 fits once a few of each stage's 8 layers are recomputed.
    best = plan_parallelism("405B", num_gpus=256)[0]
    assert 0 < best.recompute_layers < max(best.layers_per_stage) == 8
    with pytest.raises(ValueError, match="no layout of num_gpus=256 fits.*or recompute='auto'"):
        plan_parallelism("405B", num_gpus=256, recompute="none")
    assert plan_parallelism("7B", num_gpus=8)[0].recompute_layers == 0
    full = plan_parallelism("7B", num_gpus=8, recompute="full", top_k=None)
    assert all(e.recompute_layers == max(e.layers_per_stage) for e in full)


# -- recommendations (documented practice; defaults: 80 GB, ib, seq 4096, bf16, Adam, dist. opt.) --


@pytest.mark.parametrize("model", ["7B", "8B"])
@pytest.mark.parametrize("num_gpus", [8, 16, 32, 64])
def test_under_13b_dp_plus_tp_2_to_4(model, num_gpus):
    best = plan_parallelism(model, num_gpus=num_gpus, top_k=1)[0]
    assert best.dims.pp == 1 and best.dims.tp in (2, 4) and best.dims.dp == num_gpus // best.dims.tp


@pytest.mark.parametrize("model, num_gpus", [("30B", 64), ("34B", 32), ("34B", 64), ("34B", 128)])
def test_13b_to_34b_tp_4_plus_pp_2_to_4(model, num_gpus):
    best = plan_parallelism(model, num_gpus=num_gpus, top_k=1)[0]
    assert best.dims.tp == 4 and best.dims.pp in (2, 4)


@pytest.mark.parametrize("num_gpus", [16, 32])
def test_13b_is_the_boundary(num_gpus):
    # At 13B the model sees tp 2 + pp 2 and tp 4 + pp 1/2 within a few percent of each other; it
    # picks from the small-model side, and tp 4 + pp 2 is among the top layouts within 5%.
    entries = plan_parallelism("13B", num_gpus=num_gpus)
    assert entries[0].dims.tp in (2, 4) and entries[0].dims.pp in (1, 2)
    tp4_pp2 = next(e for e in entries if (e.dims.tp, e.dims.pp) == (4, 2))
    assert tp4_pp2.step_s <= entries[0].step_s * 1.05


@pytest.mark.parametrize("model, num_gpus", [("175B", 128), ("175B", 256), ("175B", 512),
                                             ("405B", 128), ("405B", 256), ("405B", 512)])
def test_over_70b_tp_8_plus_pp_8_to_16(model, num_gpus):
    best = plan_parallelism(model, num_gpus=num_gpus, top_k=1)[0]
    assert best.dims.tp == 8 and best.dims.pp in (8, 16)


@pytest.mark.parametrize("model, num_gpus", [("7B", 16), ("8B", 8), ("13B", 32), ("34B", 64), ("70B", 128),
                                             ("175B", 256)])
def test_ethernet_gets_smaller_tp_than_infiniband(model, num_gpus):
    ib = plan_parallelism(model, num_gpus=num_gpus, top_k=1)[0]
    ethernet = plan_parallelism(model, num_gpus=num_gpus, interconnect="ethernet", top_k=1)[0]
    assert ethernet.dims.tp < ib.dims.tp


def test_ranked_fastest_first_and_every_layout_valid():
    entries = plan_parallelism("70B", num_gpus=64, top_k=None)
    for earlier, later in zip(entries, entries[1:]):
        assert earlier.step_s <= later.step_s * (1 + TIE_TOLERANCE)
    for e in entries:
        assert e.dims.world_size == 64 and e.dims.tp <= 8 and 64 % e.dims.tp == 0
        assert sum(e.layers_per_stage) == 80 and e.fits
        assert e.step_s == pytest.approx(e.compute_s + e.bubble_s + e.tp_comm_s + e.pp_comm_s + e.dp_comm_s)
        # (p-1) micro-batch slots of bubble out of m + p - 1: bubble/compute = (p-1)/m
        assert e.bubble_s == pytest.approx(e.compute_s * (e.dims.pp - 1) / e.micro_batches)


def test_pinning_tp_or_pp():
    assert {e.dims.tp for e in plan_parallelism("70B", num_gpus=64, tp=4, top_k=None)} == {4}
    assert {e.dims.pp for e in plan_parallelism("70B", num_gpus=64, pp=8, top_k=None)} == {8}


def test_generation_plans_kv_cache():
    best = plan_parallelism("8B", num_gpus=8, for_="generate")[0]
    assert best.for_ == "generate" and best.dims.tp <= 2 and best.activations_gb > 10  # the KV cache
    assert plan_parallelism("70B", num_gpus=16, for_="generate")[0].dims.tp == 8
    assert all(e.fits for e in plan_parallelism("405B", num_gpus=64, for_="generate", top_k=None))


def test_format_plan():
    entries = plan_parallelism("7B", num_gpus=8, top_k=3)
    lines = format_plan(entries).splitlines()
    assert lines[0].split()[:4] == ["#", "dp", "tp", "pp"] and set(lines[1]) == {"-"}
    assert len(lines) == 2 + 3
    assert format_plan([]) == "(no layouts)"
    assert "kv cache" in format_plan(plan_parallelism("7B", num_gpus=8, for_="generate", top_k=1))


# -- bad inputs -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_gpus": 0}, "num_gpus=0 must be a positive integer"),
        ({"num_gpus": 8.0}, "num_gpus=8.0 must be a positive integer"),
        ({"num_gpus": True}, "num_gpus=True must be a positive integer"),
        ({"num_gpus": 8, "gpu_memory_gb": -1}, "gpu_memory_gb=-1 must be a positive number"),
        ({"num_gpus": 8, "interconnect": "infiniband"},
         "unknown interconnect='infiniband'; use one of 'nvlink_ib', 'ib', 'ethernet'"),
        ({"num_gpus": 8, "for_": "both"}, "unknown for_='both'"),
        ({"num_gpus": 8, "dtype": "fp8"}, "unknown dtype='fp8'"),
        ({"num_gpus": 12, "tp": 3},
         "tensor_model_parallel_size=3 does not divide num_attention_heads=32; use 1, 2, 4, 8, 16 or 32"),
        ({"num_gpus": 8, "tp": 3}, r"3\*1 does not divide num_gpus=8"),
        ({"num_gpus": 32, "tp": 16, "gpus_per_node": 8}, "tensor_model_parallel_size=16 exceeds gpus_per_node=8"),
        ({"num_gpus": 64, "pp": 64}, "pipeline_model_parallel_size=64 exceeds num_layers=32"),
    ],
)
def test_bad_inputs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        plan_parallelism("7B", **kwargs)


def test_no_fit_names_smallest_memory_and_more_gpus():
    with pytest.raises(ValueError) as info:
        plan_parallelism("405B", num_gpus=8)
    message = str(info.value)
    assert "no layout of num_gpus=8 fits" in message and "72.0 GB usable" in message
    assert "the smallest needs" in message and "use num_gpus=128 or more" in message


def test_no_fit_when_pp_would_exceed_layers():
    # Two huge layers: even tp=8 with one layer per stage overflows 16 GB, so more GPUs cannot help.
    wide = {"num_hidden_layers": 2, "hidden_size": 16384, "num_attention_heads": 128, "intermediate_size": 53248,
            "vocab_size": 128256}
    match = r"more than num_layers\*tp = 2\*8 = 16 GPUs.*pipeline_model_parallel_size > num_layers=2"
    with pytest.raises(ValueError, match=match):
        plan_parallelism(wide, num_gpus=8, gpu_memory_gb=16)


def test_interconnects_describe_themselves():
    assert set(INTERCONNECTS) == {"nvlink_ib", "ib", "ethernet"}
    for link in INTERCONNECTS.values():
        assert link.description and link.intra_node_gbps > link.inter_node_gbps


# -- flowrl parallel-plan -------------------------------------------------------------------------


def _run(argv):
    parser = argparse.ArgumentParser(prog="flowrl parallel-plan")
    plan_cli.add_arguments(parser)
    return plan_cli.run(parser.parse_args(argv))


def test_cli_table(capsys):
    assert _run(["--model", "70B", "--gpus", "64", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("llama-3-70b: 70.55B parameters")
    assert "train: one optimizer step of 1,048,576 tokens" in out
    assert len([line for line in out.splitlines() if line[:1].isdigit()]) == 3


def test_cli_both_and_json(capsys, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256}))
    assert _run(["--model", str(tmp_path), "--gpus", "16", "--for", "both", "--json", "--top", "2"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["model"]["num_params"] == 8_030_261_248
    assert set(data["plans"]) == {"train", "generate"} and len(data["plans"]["train"]) == 2
    first = data["plans"]["train"][0]
    assert first["dims"]["dp"] * first["dims"]["tp"] * first["dims"]["pp"] == 16 and first["for"] == "train"


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--model", "7B", "--gpus", "0"], "error: num_gpus=0 must be a positive integer"),
        (["--model", "7B", "--gpus", "8", "--interconnect", "wifi"], "error: unknown interconnect='wifi'"),
        (["--model", "7B", "--gpus", "12", "--tp", "3"], "error: tensor_model_parallel_size=3 does not divide"),
        (["--model", "seven", "--gpus", "8"], "error: model='seven' is neither"),
    ],
)
def test_cli_errors_exit_2(capsys, argv, match):
    assert _run(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(match) and captured.out == ""
