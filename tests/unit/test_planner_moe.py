"""The planner at 5D: mixture-of-experts shapes (presets and config.json), expert and context
parallel layouts, their memory split and communication, the pins' errors, and the CLI."""

import argparse
import json
import math
import time

import pytest

from flowrl.parallel import plan_cli
from flowrl.parallel.layout_cost import GB, REFERENCE_BYTES
from flowrl.parallel.layout_search import explain_memory, format_plan, plan_parallelism
from flowrl.parallel.model_spec import PRESETS, ModelSpec, parse_model

# -- shapes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, total, active", [
    ("deepseek-v3", 671e9, 37e9),  # the model card: 671B total, 37B activated
    ("qwen3-235b-a22b", 235e9, 22e9),
    ("qwen3-30b-a3b", 30.5e9, 3.3e9),
])
def test_presets_have_the_model_cards_counts(name, total, active):
    spec = parse_model(name)
    assert spec is PRESETS[name] and spec.is_moe
    assert spec.num_params == pytest.approx(total, rel=0.01)
    assert spec.num_active_params == pytest.approx(active, rel=0.03)
    assert parse_model(name.upper()) is spec


def test_moe_and_mla_fields_come_from_config_json():
    deepseek = {  # DeepSeek-V3's config.json, the keys the shape reads
        "model_type": "deepseek_v3", "num_hidden_layers": 61, "hidden_size": 7168, "num_attention_heads": 128,
        "num_key_value_heads": 128, "intermediate_size": 18432, "moe_intermediate_size": 2048,
        "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
        "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
        "v_head_dim": 128, "vocab_size": 129280, "hidden_act": "silu", "tie_word_embeddings": False,
    }
    spec = ModelSpec.from_hf_config(deepseek)
    assert spec.num_params == PRESETS["deepseek-v3"].num_params
    assert spec.num_active_params == PRESETS["deepseek-v3"].num_active_params
    qwen3 = {  # Qwen3-30B-A3B's
        "model_type": "qwen3_moe", "num_hidden_layers": 48, "hidden_size": 2048, "num_attention_heads": 32,
        "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144, "moe_intermediate_size": 768,
        "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "vocab_size": 151936, "hidden_act": "silu", "tie_word_embeddings": False,
    }
    spec = ModelSpec.from_hf_config(qwen3)
    assert (spec.num_params, spec.num_active_params) == (
        PRESETS["qwen3-30b-a3b"].num_params, PRESETS["qwen3-30b-a3b"].num_active_params)
    mixtral = {"model_type": "mixtral", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
               "num_key_value_heads": 8, "intermediate_size": 14336, "num_local_experts": 8,
               "num_experts_per_tok": 2, "vocab_size": 32000, "hidden_act": "silu"}
    spec = ModelSpec.from_hf_config(mixtral)
    assert spec.num_params == pytest.approx(46.7e9, rel=0.01)  # Mixtral-8x7B: 46.7B, 12.9B active
    assert spec.num_active_params == pytest.approx(12.9e9, rel=0.01)


def test_dense_shapes_are_unchanged_by_the_moe_fields():
    llama = parse_model("7B")
    assert not llama.is_moe and llama.num_active_params == llama.num_params == 6_738_415_616
    assert llama.num_expert_params == 0


def test_a_moe_spec_validates_its_experts():
    base = dict(num_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                ffn_hidden_size=128, vocab_size=100)
    with pytest.raises(ValueError, match="experts_per_token <= num_experts"):
        ModelSpec(**base, num_experts=4, experts_per_token=8, moe_ffn_hidden_size=32)
    with pytest.raises(ValueError, match="num_dense_layers=3 exceeds num_layers=2"):
        ModelSpec(**base, num_experts=4, experts_per_token=2, moe_ffn_hidden_size=32, num_dense_layers=3)


# -- layouts --------------------------------------------------------------------------------------


def test_deepseek_v3_on_512_gpus_gets_expert_parallel_layouts_fast():
    start = time.perf_counter()
    entries = plan_parallelism("deepseek-v3", num_gpus=512, top_k=None)
    assert time.perf_counter() - start < 5.0  # 0.1-0.2 s measured; generous for a loaded machine
    assert entries and all(e.fits for e in entries)
    assert entries[0].ep > 1
    spec = PRESETS["deepseek-v3"]
    for e in entries:
        assert e.num_gpus == 512 and spec.num_experts % e.ep == 0
        assert (e.dims.tp * e.cp * e.dims.dp) % (e.ep * e.etp) == 0  # megatron's expert layout
        assert e.step_s == pytest.approx(e.compute_s + e.bubble_s + e.tp_comm_s + e.pp_comm_s + e.dp_comm_s
                                         + e.ep_comm_s + e.cp_comm_s)
    # every stage's routed experts, split over ep x etp: the experts' share of the weights
    best = entries[0]
    assert 0 < best.expert_weights_gb < best.weights_gb
    stage_layers = max(best.layers_per_stage)
    experts_at_most = stage_layers * spec.num_experts * spec.expert_params / (best.ep * best.etp) * 2 / GB
    assert best.expert_weights_gb <= experts_at_most * 1.0001


def test_more_expert_parallelism_splits_the_experts():
    kw = dict(num_gpus=64, tp=1, pp=4, etp=1, top_k=None, recompute="full")
    by_ep = {ep: plan_parallelism("qwen3-30b-a3b", ep=ep, **kw)[0] for ep in (2, 8)}
    assert by_ep[2].expert_weights_gb == pytest.approx(4 * by_ep[8].expert_weights_gb, rel=1e-6)
    assert by_ep[8].ep_comm_s > 0
    assert by_ep[8].reference_gb == pytest.approx(by_ep[8].weights_gb * REFERENCE_BYTES / 2)


def test_compute_counts_the_active_parameters():
    spec = PRESETS["qwen3-30b-a3b"]
    more_experts = ModelSpec(**{**spec.__dict__, "name": "x", "num_experts": 2 * spec.num_experts})
    kw = dict(num_gpus=64, tp=2, pp=2, ep=8, etp=1, top_k=None, recompute="full", gpu_memory_gb=1000)
    a, b = plan_parallelism(spec, **kw)[0], plan_parallelism(more_experts, **kw)[0]
    assert b.compute_s == pytest.approx(a.compute_s, rel=0.01)  # same top-k, same work per token
    assert b.expert_weights_gb == pytest.approx(2 * a.expert_weights_gb, rel=1e-6)


def test_long_sequences_search_context_parallelism():
    short = plan_parallelism("8B", num_gpus=16, top_k=None)
    assert {e.cp for e in short} == {1}
    long = plan_parallelism("8B", num_gpus=16, seq_len=65536, global_batch_tokens=2**21, top_k=None)
    assert any(e.cp > 1 for e in long)
    one = plan_parallelism("8B", num_gpus=16, seq_len=65536, global_batch_tokens=2**21, tp=2, pp=1, cp=1,
                           recompute="full", top_k=1, gpu_memory_gb=200)[0]
    two = plan_parallelism("8B", num_gpus=16, seq_len=65536, global_batch_tokens=2**21, tp=2, pp=1, cp=2,
                           recompute="full", top_k=1, gpu_memory_gb=200)[0]
    assert two.cp == 2 and two.dims.dp * 2 == one.dims.dp
    assert two.activations_gb == pytest.approx(one.activations_gb / 2, rel=0.01)
    assert two.cp_comm_s > 0 == one.cp_comm_s
    assert "cp comm" in format_plan([two])


@pytest.mark.parametrize("kwargs, match", [
    (dict(model="7B", ep=2), "dense model"),
    (dict(model="qwen3-30b-a3b", ep=3), "does not divide the 128 experts"),
    (dict(model="qwen3-30b-a3b", ep=2, for_="generate"), "generation plan splits experts over tp"),
    (dict(model="8B", cp=3), "seq_len divisible by 2\\*cp"),
    (dict(model="qwen3-30b-a3b", ep=2, fully_sharded=True), "shards experts like any parameter"),
    (dict(model="8B", cp=0), "context_parallel_size=0 must be a positive integer"),
])
def test_pins_of_the_new_axes_are_checked(kwargs, match):
    model = kwargs.pop("model")
    with pytest.raises(ValueError, match=match):
        plan_parallelism(model, num_gpus=16, **kwargs)


def test_generation_reads_only_the_experts_a_batch_touches():
    e = plan_parallelism("qwen3-30b-a3b", num_gpus=8, for_="generate", tp=2, top_k=1)[0]
    spec = PRESETS["qwen3-30b-a3b"]
    assert e.weights_gb == pytest.approx(spec.num_params * 2 / 2 / GB, rel=0.02)  # everything over tp 2
    dense = parse_model("30B")  # a dense model of the same size decodes slower: it reads all its weights
    d = plan_parallelism(dense, num_gpus=8, for_="generate", tp=2, top_k=1)[0]
    assert e.step_s < d.step_s


def test_explain_memory_names_the_split():
    spec = PRESETS["deepseek-v3"]
    best = plan_parallelism(spec, num_gpus=512, top_k=1)[0]
    text = explain_memory(best, spec)
    assert f"/ ep {best.ep}" in text and "expert-dp" in text and "37.6B active" in text
    assert f"{spec.num_experts // best.ep} of 256 experts" in text


def _cli(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    plan_cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_cli_plans_deepseek_v3_on_512_gpus(capsys):
    assert plan_cli.run(_cli("--model", "deepseek-v3", "--gpus", "512", "--top", "3")) == 0
    out = capsys.readouterr().out
    assert "37.6B active: 8 of 256 experts per token, MLA" in out
    header = next(line for line in out.splitlines() if line.startswith("#"))
    assert header.split()[:6] == ["#", "dp", "tp", "pp", "ep", "etp"]
    assert "memory per GPU of" in out and "expert-dp" in out
    assert plan_cli.run(_cli("--model", "qwen3-30b-a3b", "--gpus", "16", "--ep", "8", "--json")) == 0
    data = json.loads(capsys.readouterr().out)
    assert {e["dims"]["ep"] for e in data["plans"]["train"]} == {8}
    assert data["model"]["num_active_params"] < data["model"]["num_params"] / 5
    assert plan_cli.run(_cli("--model", "7B", "--gpus", "8", "--ep", "2")) == 2
    assert "dense model" in capsys.readouterr().err
    assert not math.isnan(data["plans"]["train"][0]["ep_comm_s"])
