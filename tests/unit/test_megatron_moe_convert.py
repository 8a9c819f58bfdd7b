"""Mixture-of-experts pieces of the megatron backend without a process group: the HF <-> megatron
expert conversion under every (tp, ep, etp) split, the fused (in-memory) vs per-expert (on-disk)
layouts, megatron's router settings against transformers' routers, and the layout checks."""

from __future__ import annotations

import types

import pytest
import torch

pytest.importorskip("megatron.core")

from flowrl.backends.train.megatron.convert import (  # noqa: E402
    arch_spec, check_expert_layout, experts_to_global, fuse_experts, hf_to_megatron, is_expert_param,
    megatron_to_hf)


def _model(arch: str = "qwen3_moe", **overrides):
    from transformers import MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    common = dict(vocab_size=37, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=4, num_experts_per_tok=2, max_position_embeddings=32,
                  tie_word_embeddings=False)
    if arch == "qwen3_moe":
        config = Qwen3MoeConfig(**common, num_experts=4, moe_intermediate_size=8, intermediate_size=32,
                                **{"norm_topk_prob": True, **overrides})
        model = Qwen3MoeForCausalLM(config)
    else:
        config = MixtralConfig(**common, num_local_experts=4, intermediate_size=8, **overrides)
        model = MixtralForCausalLM(config)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    return model


def _per_expert(state: dict) -> dict:
    """The fused state under per-expert names, by plain indexing (as save_pretrained writes it)."""
    out = {}
    for name, t in state.items():
        if name.endswith("experts.gate_up_proj"):
            for e in range(t.shape[0]):
                gate, up = t[e].chunk(2)
                out[f"{name[:-12]}{e}.gate_proj.weight"], out[f"{name[:-12]}{e}.up_proj.weight"] = gate, up
        elif name.endswith("experts.down_proj"):
            for e in range(t.shape[0]):
                out[f"{name[:-9]}{e}.down_proj.weight"] = t[e]
        else:
            out[name] = t
    return out


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral"])
@pytest.mark.parametrize("tp,pp,ep,etp", [(1, 1, 1, 1), (1, 1, 2, 1), (2, 1, 2, 2), (1, 2, 4, 1),
                                          (2, 2, 2, 1), (1, 1, 2, 2)])
def test_round_trip_every_expert_split(arch, tp, pp, ep, etp):
    """Each (tp, pp) chunk from ep_rank 0 (dense part) plus every (ep, etp) rank's experts, renamed
    to global indices as the engine gathers them, converts back to the checkpoint exactly."""
    model = _model(arch)
    hf = _per_expert(model.state_dict())
    hf.pop("lm_head.weight") if model.config.tie_word_embeddings else None
    shards: dict = {}
    num_local = 4 // ep
    for pp_rank in range(pp):
        for tp_rank in range(tp):
            shard = hf_to_megatron(hf, model.config, tp_rank=tp_rank, tp=tp, pp_rank=pp_rank, pp=pp,
                                   ep_rank=0, ep=ep, etp_rank=0, etp=etp)
            shards[(tp_rank, pp_rank, None)] = {k: v for k, v in shard.items() if not is_expert_param(k)}
        for ep_rank in range(ep):
            for etp_rank in range(etp):
                shard = hf_to_megatron(hf, model.config, tp_rank=0, tp=tp, pp_rank=pp_rank, pp=pp,
                                       ep_rank=ep_rank, ep=ep, etp_rank=etp_rank, etp=etp)
                local = {k: v for k, v in shard.items() if is_expert_param(k)}
                assert len(local) == 2 * num_local * (2 // pp)  # fc1, fc2 of each local expert and layer
                shards.setdefault((etp_rank, pp_rank, None), {}).update(
                    experts_to_global(local, ep_rank=ep_rank, num_local_experts=num_local))
    back = megatron_to_hf(shards, model.config, tp=tp, pp=pp, etp=etp)
    assert set(back) == set(hf)
    for name, t in hf.items():
        assert torch.equal(back[name], t), name


def test_expert_shard_contents():
    """ep rank 1 of 2 holds global experts 2 and 3 as local 0 and 1: fc1 = [gate rows; up rows] of
    its etp slice, fc2 the etp columns of down_proj; the router and q/k norms are whole."""
    model = _model()
    hf = _per_expert(model.state_dict())
    shard = hf_to_megatron(hf, model.config, tp_rank=1, tp=2, pp_rank=0, pp=1, ep_rank=1, ep=2,
                           etp_rank=1, etp=2)
    x, h = "decoder.layers.1.mlp.experts.local_experts.0.", "model.layers.1.mlp.experts.2."
    want_fc1 = torch.cat([hf[h + "gate_proj.weight"][4:8], hf[h + "up_proj.weight"][4:8]])
    assert torch.equal(shard[x + "linear_fc1.weight"], want_fc1)
    assert torch.equal(shard[x + "linear_fc2.weight"], hf[h + "down_proj.weight"][:, 4:8])
    assert torch.equal(shard["decoder.layers.1.mlp.router.weight"], hf["model.layers.1.mlp.gate.weight"])
    assert torch.equal(shard["decoder.layers.0.self_attention.q_layernorm.weight"],
                       hf["model.layers.0.self_attn.q_norm.weight"])
    assert not any(k.endswith("mlp.linear_fc1.weight") for k in shard)  # no dense MLP


def test_fused_state_reads_like_per_expert_names_and_fuses_back():
    """A loaded model's fused state dict converts exactly as the checkpoint's per-expert names do;
    fuse_experts gives the fused layout back (what save_hf loads into the transformers model)."""
    model = _model()
    fused = model.state_dict()
    hf = _per_expert(fused)
    for ep_rank in range(2):
        a = hf_to_megatron(fused, model.config, tp_rank=0, tp=2, pp_rank=0, pp=1, ep_rank=ep_rank, ep=2)
        b = hf_to_megatron(hf, model.config, tp_rank=0, tp=2, pp_rank=0, pp=1, ep_rank=ep_rank, ep=2)
        assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    again = fuse_experts(hf, arch_spec(model.config))
    assert set(again) == set(fused)
    assert all(torch.equal(again[k], fused[k]) for k in fused)


def test_arch_spec_moe_facts_and_refusals():
    q = arch_spec(_model().config)
    assert (q.moe.num_experts, q.moe.topk, q.moe.ffn_hidden_size, q.moe.norm_topk_prob, q.qk_norm) == (4, 2, 8, True, True)
    m = arch_spec(_model("mixtral").config)
    assert (m.moe.num_experts, m.moe.ffn_hidden_size, m.moe.norm_topk_prob, m.qk_norm) == (4, 8, True, False)
    with pytest.raises(ValueError, match="mlp_only_layers"):
        arch_spec(_model(mlp_only_layers=[0]).config)
    with pytest.raises(ValueError, match="expert_model_parallel_size=3 does not divide"):
        check_expert_layout(q, ep=3, etp=1)
    with pytest.raises(ValueError, match="expert_tensor_parallel_size=3 does not divide"):
        check_expert_layout(q, ep=2, etp=3)


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_megatron_routing_equals_transformers_router(norm_topk_prob):
    """moe_config_kwargs's router settings (softmax; pre-softmax only without renormalisation; no
    scaling) give transformers' expert choices and weights."""
    from megatron.core.transformer.moe.moe_utils import topk_routing_with_score_function
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    from flowrl.backends.train.megatron.model import moe_config_kwargs

    model = _model(norm_topk_prob=norm_topk_prob)
    kw = moe_config_kwargs(arch_spec(model.config))
    router = Qwen3MoeTopKRouter(model.config)
    torch.nn.init.normal_(router.weight)
    x = torch.randn(50, 16)
    _, weights, index = router(x)
    probs, routing_map = topk_routing_with_score_function(
        torch.nn.functional.linear(x, router.weight), kw["moe_router_topk"],
        use_pre_softmax=kw["moe_router_pre_softmax"], scaling_factor=kw["moe_router_topk_scaling_factor"],
        score_function=kw["moe_router_score_function"])
    want = torch.zeros(50, 4).scatter(1, index, weights)
    assert torch.equal(routing_map, want > 0)
    assert torch.allclose(probs, want, atol=1e-7, rtol=0)
    assert kw["moe_expert_capacity_factor"] is None and kw["moe_token_dispatcher_type"] == "alltoall"


def test_options_check_expert_layout_names_key_value_fix():
    from flowrl.backends.train.megatron.options import check_expert_layout as check_cfg
    from flowrl.config import ConfigError
    from flowrl.config.megatron import MegatronConfig

    hf = _model().config

    def group(dp, tp, ep, etp=None):
        return types.SimpleNamespace(data_parallel_size=dp, tensor_model_parallel_size=tp,
                                     megatron=MegatronConfig(expert_model_parallel_size=ep,
                                                             expert_tensor_parallel_size=etp))

    check_cfg("actor", group(2, 2, 2), hf, "m")  # etp = tp = 2, ep 2: 4 expert ranks of dp x tp = 4
    with pytest.raises(ConfigError, match="actor.megatron.expert_model_parallel_size.*3.*4 experts"):
        check_cfg("actor", group(3, 1, 3), hf, "m")
    with pytest.raises(ConfigError, match="does not divide data_parallel_size x tensor_model_parallel_size"):
        check_cfg("actor", group(1, 2, 2), hf, "m")
    with pytest.raises(ConfigError, match="expert_tensor_parallel_size.*experts' width 8"):
        check_cfg("ref", group(3, 1, 1, etp=3), hf, "m")
    dense = types.SimpleNamespace(model_type="qwen2")
    with pytest.raises(ConfigError, match="no experts"):
        check_cfg("actor", group(2, 1, 2), dense, "m")
    with pytest.raises(ConfigError, match="expert_model_parallel_size=0"):
        MegatronConfig(expert_model_parallel_size=0)
