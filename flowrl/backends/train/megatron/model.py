"""Llama / Qwen2 / Qwen3-MoE / Mixtral as a megatron-core GPTModel (local layer spec: plain torch,
no Transformer Engine).

GQA, RoPE with the checkpoint's rope_theta (and Llama-3 frequency scaling), RMSNorm, SwiGLU, the
Qwen2 qkv bias, Qwen3's per-head q/k RMSNorm and tied or untied embeddings. Mixture-of-experts
layers (:func:`moe_config_kwargs`): megatron's SequentialMLP experts (``moe_grouped_gemm=False``),
the all-to-all token dispatcher (gloo has all-to-all), dropless routing that reproduces the HF
router exactly. The vocabulary is padded for tensor parallelism
(``convert.padded_vocab_size``); the padded rows are zero and ``vocab_parallel.py`` leaves their
logits out of the softmax, so token log-probabilities match transformers.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.tensor_parallel import (
    ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding)
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.transformer_block import (
    TransformerBlockSubmodules, get_num_layers_to_build)

from flowrl.backends.train.megatron.convert import arch_spec
from flowrl.parallel.mesh import padded_vocab_size

# megatron's RotaryEmbedding._apply_scaling (rotary_pos_embedding.py:92) fixes these Llama-3 values.
_MEGATRON_LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192}


def moe_config_kwargs(arch: Any, *, ep: int = 1, etp: int | None = None, tp: int = 1,
                      aux_loss_coeff: float = 0.0, z_loss_coeff: float | None = None) -> dict:
    """TransformerConfig's MoE fields for ``arch.moe`` (empty for a dense model).

    HF's routers take the softmax over all experts, then the top k, then (``norm_topk_prob``, and
    always in Mixtral) divide by their sum: that equals the softmax over the top-k logits, which is
    megatron's ``moe_router_pre_softmax=False`` softmax routing (moe_utils.py
    topk_routing_with_score_function); without renormalisation it is ``pre_softmax=True``. No
    scaling factor, no expert bias, no capacity (dropless), the router in fp32 as HF computes it.
    ``aux_loss_coeff`` > 0: megatron's switch load-balancing loss (``aux_loss``) is added to the
    gradient; ``z_loss_coeff``: the router z-loss (ST-MoE) is."""
    moe = arch.moe
    if moe is None:
        return {}
    return dict(
        num_moe_experts=moe.num_experts,
        moe_router_topk=moe.topk,
        moe_ffn_hidden_size=moe.ffn_hidden_size,
        moe_grouped_gemm=False,
        moe_token_dispatcher_type="alltoall",
        moe_router_score_function="softmax",
        moe_router_pre_softmax=not moe.norm_topk_prob,
        moe_router_topk_scaling_factor=None,
        moe_router_dtype="fp32",
        moe_router_load_balancing_type="aux_loss" if aux_loss_coeff > 0 else "none",
        moe_aux_loss_coeff=float(aux_loss_coeff),
        moe_z_loss_coeff=z_loss_coeff or None,
        moe_expert_capacity_factor=None,
        moe_permute_fusion=False,
        moe_router_fusion=False,
        expert_model_parallel_size=ep,
        expert_tensor_parallel_size=tp if etp is None else etp,
        # MoE with tp > 1 trains only with sequence parallelism (moe_layer.py:379 raises otherwise)
        sequence_parallel=tp > 1,
    )


def transformer_config_from_hf(hf_config: Any, *, tp: int, pp: int, vpp: int | None = None,
                               params_dtype: torch.dtype = torch.float32,
                               use_cpu_initialization: bool | None = None,
                               ep: int = 1, etp: int | None = None, moe_aux_loss_coeff: float = 0.0,
                               moe_z_loss_coeff: float | None = None,
                               **overrides: Any) -> TransformerConfig:
    """A TransformerConfig mirroring a transformers Llama/Qwen2 config.

    Initialisation is skipped (weights are loaded from the checkpoint); fusions that need CUDA
    kernels are off; ``calculate_per_token_loss=True`` so megatron neither divides the loss by the
    number of micro-batches nor averages gradients over data-parallel ranks (the engine's loss is
    already normalised by global token counts). ``overrides`` are passed to TransformerConfig.
    """
    arch = arch_spec(hf_config)
    if use_cpu_initialization is None:
        use_cpu_initialization = not torch.cuda.is_available()
    kwargs = dict(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        ffn_hidden_size=arch.ffn_hidden_size,
        num_attention_heads=arch.num_heads,
        num_query_groups=arch.num_kv_heads,
        kv_channels=arch.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=arch.norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=arch.qkv_bias,
        qk_layernorm=arch.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp,
        params_dtype=params_dtype,
        pipeline_dtype=params_dtype,
        bf16=params_dtype == torch.bfloat16,
        fp16=params_dtype == torch.float16,
        use_cpu_initialization=use_cpu_initialization,
        perform_initialization=False,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        attention_softmax_in_fp32=True,
        calculate_per_token_loss=True,
        # Interleaved schedule: unbatched, overlapped p2p (Megatron-LM's default for it). Batched
        # p2p posts send_prev, recv_prev, send_next, recv_next on every rank
        # (p2p_communication.py:16-51); with pp=2 both neighbours are the same rank, so a
        # gradient is matched with an activation receive (measured on gloo: wrong gradients).
        # _p2p_ops (p2p_communication.py:54) orders even/odd ranks so the pairs match.
        overlap_p2p_comm=vpp is not None,
        batch_p2p_comm=vpp is None,
    )
    moe = moe_config_kwargs(arch, ep=ep, etp=etp, tp=tp, aux_loss_coeff=moe_aux_loss_coeff, z_loss_coeff=moe_z_loss_coeff)
    return TransformerConfig(**{**kwargs, **moe, **overrides})


def _rope_kwargs(hf_config: Any) -> dict:
    arch = arch_spec(hf_config)
    rope = arch.rope_parameters
    rope_type = rope.get("rope_type", "default")
    kwargs = {"rotary_base": arch.rope_theta}
    if rope_type == "default":
        return kwargs
    if rope_type == "llama3":
        mismatched = {k: rope.get(k) for k, v in _MEGATRON_LLAMA3_ROPE.items() if rope.get(k) != v}
        if mismatched:
            raise ValueError(f"llama3 rope parameters {mismatched} differ from megatron's fixed "
                             f"{_MEGATRON_LLAMA3_ROPE}; this checkpoint is not supported")
        return {**kwargs, "rope_scaling": True, "rope_scaling_factor": float(rope["factor"])}
    raise ValueError(f"rope_type={rope_type!r} is not supported; supported: 'default', 'llama3'")


def build_gpt_model(hf_config: Any, *, config: TransformerConfig, pre_process: bool,
                    post_process: bool, vp_stage: int | None = None,
                    make_vocab_size_divisible_by: int = 128) -> GPTModel:
    """One model chunk (a pipeline stage, or a virtual stage of it) of the HF architecture."""
    arch = arch_spec(hf_config)
    model = _build(hf_config, arch, config=config, pre_process=pre_process,
                   post_process=post_process, vp_stage=vp_stage,
                   make_vocab_size_divisible_by=make_vocab_size_divisible_by)
    _mark_tensor_parallel_weights(model)
    return model


def _mark_tensor_parallel_weights(model: torch.nn.Module) -> None:
    """Tag TP-sharded weights as megatron's initialisers would have.

    megatron-core 0.16.1 sets ``tensor_model_parallel``/``partition_dim`` on the weights of
    VocabParallelEmbedding / ColumnParallelLinear / RowParallelLinear only inside its weight
    initialisers (tensor_parallel/layers.py:244, :855/:877, :1178/:1201), which
    ``perform_initialization=False`` skips. Untagged, every TP rank but 0 drops its shards from the
    gradient norm (optimizer.py:156), so clipping uses a wrong norm.
    """
    for module in model.modules():
        if isinstance(module, (VocabParallelEmbedding, ColumnParallelLinear)):
            dim = 0
        elif isinstance(module, RowParallelLinear):
            dim = 1
        else:
            continue
        weight = getattr(module, "weight", None)
        if weight is not None and not hasattr(weight, "tensor_model_parallel"):
            weight.tensor_model_parallel = True
            weight.partition_dim, weight.partition_stride = dim, 1


class SequenceParallelRMSNorm(torch.nn.RMSNorm):
    """torch's RMSNorm with megatron's norm signature, for sequence parallelism (which megatron's
    local-spec ``WrappedTorchNorm`` refuses, torch_norm.py:32): its weight is marked
    ``sequence_parallel`` so that ``finalize_model_grads`` sums its gradient over the tp ranks, each
    of which normalised its own slice of the sequence (finalize_model_grads.py:354)."""

    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = 1e-5, **unused: Any):
        super().__init__(normalized_shape=hidden_size, eps=eps)
        self.weight.sequence_parallel = config.sequence_parallel


class HeadRMSNorm(torch.nn.RMSNorm):
    """torch's RMSNorm for Qwen3's per-head q/k norms under sequence parallelism: applied after
    attention gathered the sequence, so not sequence-parallel; megatron sums its gradient over tp
    ranks by name (each rank holds other heads, finalize_model_grads.py:355)."""

    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = 1e-5, **unused: Any):
        super().__init__(normalized_shape=hidden_size, eps=eps)


def _layer_spec(config: TransformerConfig, arch: Any, vp_stage: int | None):
    """The local layer spec; with sequence parallelism its norms (and the block's final norm)
    are the sequence-parallel RMSNorms above."""
    spec = get_gpt_layer_local_spec(num_experts=arch.moe.num_experts if arch.moe else None,
                                    moe_grouped_gemm=False, qk_layernorm=arch.qk_norm,
                                    normalization="RMSNorm")
    if not config.sequence_parallel:
        return spec
    layer = spec.submodules
    layer.input_layernorm = layer.pre_mlp_layernorm = SequenceParallelRMSNorm
    if arch.qk_norm:
        layer.self_attention.submodules.q_layernorm = HeadRMSNorm
        layer.self_attention.submodules.k_layernorm = HeadRMSNorm
    return TransformerBlockSubmodules(layer_specs=[spec] * get_num_layers_to_build(config, vp_stage=vp_stage),
                                      layer_norm=SequenceParallelRMSNorm)


def _build(hf_config, arch, *, config, pre_process, post_process, vp_stage,
           make_vocab_size_divisible_by) -> GPTModel:
    vocab = padded_vocab_size(arch.vocab_size, config.tensor_model_parallel_size,
                              make_vocab_size_divisible_by)
    return GPTModel(
        config=config,
        transformer_layer_spec=_layer_spec(config, arch, vp_stage),
        vocab_size=vocab,
        max_sequence_length=arch.max_position_embeddings,
        pre_process=pre_process,
        post_process=post_process,
        parallel_output=True,
        share_embeddings_and_output_weights=arch.tied_embeddings,
        position_embedding_type="rope",
        vp_stage=vp_stage,
        **_rope_kwargs(hf_config),
    )
