"""Tiny Qwen2 / Llama causal LMs, and Qwen3-MoE / Mixtral mixture-of-experts ones, built from a
config for the default task, tests and benchmarks.

They are ordinary ``transformers`` models (``Qwen2ForCausalLM``, ``LlamaForCausalLM``,
``Qwen3MoeForCausalLM``, ``MixtralForCausalLM``) in fp32, so
every code path (loading, HF <-> Megatron conversion, generation) is the one real checkpoints use.
Weights are initialised from ``seed`` without disturbing the caller's global RNG.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

ARCHITECTURES = ("qwen2", "llama", "qwen3_moe", "mixtral")
# The mixture-of-experts architectures: every layer is sparse (a router picks `num_experts_per_tok`
# of `num_experts` experts per token).
MOE_ARCHITECTURES = ("qwen3_moe", "mixtral")

# Keyword arguments of `build_tiny_model` per preset. Head counts divide by 2 and 4 so the models
# can be split with tensor parallelism, and layer counts by 2 for pipeline parallelism.
TINY_PRESETS: dict[str, dict[str, Any]] = {
    # ~0.13M parameters: a GRPO step on 256 ten-token samples takes well under a second on a core.
    # Eight narrow heads (head_dim 8) learn the addition task far more reliably than four wider
    # ones; vLLM's kernels do not support head_dim 8, so use "10m" there.
    "default": dict(
        arch="qwen2",
        hidden_size=64,
        num_layers=2,
        num_heads=8,
        num_kv_heads=4,
        intermediate_size=256,
        tie_word_embeddings=True,
    ),
    # ~0.4M parameters with head_dim 32, the smallest head vLLM's CPU attention takes: the
    # default task for rollout.name=vllm tests.
    "vllm": dict(
        arch="qwen2",
        hidden_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=256,
        tie_word_embeddings=True,
    ),
    # ~9.5M parameters (head_dim 64), for benchmarks.
    "10m": dict(
        arch="qwen2",
        hidden_size=512,
        num_layers=4,
        num_heads=8,
        num_kv_heads=4,
        intermediate_size=1024,
        tie_word_embeddings=True,
    ),
    # ~0.13M parameters, Qwen3-MoE: 2 layers of 4 experts (2 per token, expert width 64) and the
    # default preset's attention; the experts divide by 2 and 4 for expert parallelism.
    "moe": dict(
        arch="qwen3_moe",
        hidden_size=64,
        num_layers=2,
        num_heads=8,
        num_kv_heads=4,
        intermediate_size=256,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        tie_word_embeddings=True,
    ),
}


def _check_shape(arch: str, hidden_size: int, num_heads: int, num_kv_heads: int) -> None:
    """ValueError for an unknown ``arch`` or heads that do not divide the hidden size / each other."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"arch={arch!r} is not supported; use one of {', '.join(ARCHITECTURES)}")
    if hidden_size % num_heads != 0:
        raise ValueError(
            f"hidden_size={hidden_size} is not divisible by num_heads={num_heads}; "
            "pick a hidden_size that is a multiple of num_heads"
        )
    if num_heads % num_kv_heads != 0:
        raise ValueError(
            f"num_heads={num_heads} is not divisible by num_kv_heads={num_kv_heads}; "
            "pick num_kv_heads that divides num_heads"
        )


def _moe_kwargs(arch: str, *, num_experts: int, num_experts_per_tok: int, moe_intermediate_size: int,
                intermediate_size: int, head_dim: int) -> tuple[dict[str, Any], int]:
    """The config's mixture-of-experts keywords for ``arch`` (none for a dense one) and its
    ``intermediate_size`` (mixtral's experts are that wide); ValueError for experts on a dense arch."""
    moe: dict[str, Any] = {}
    if arch in MOE_ARCHITECTURES:
        if not 1 <= num_experts_per_tok <= num_experts:
            raise ValueError(
                f"a {arch} model needs 1 <= num_experts_per_tok <= num_experts, got "
                f"num_experts_per_tok={num_experts_per_tok}, num_experts={num_experts}; "
                "e.g. num_experts=4, num_experts_per_tok=2"
            )
        width = moe_intermediate_size or intermediate_size
        if arch == "qwen3_moe":
            moe = dict(num_experts=num_experts, num_experts_per_tok=num_experts_per_tok,
                       moe_intermediate_size=width, head_dim=head_dim,
                       norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
        else:  # mixtral: the expert width is intermediate_size
            moe = dict(num_local_experts=num_experts, num_experts_per_tok=num_experts_per_tok,
                       head_dim=head_dim)
            intermediate_size = width
    elif num_experts:
        raise ValueError(
            f"num_experts={num_experts} needs a mixture-of-experts arch "
            f"({', '.join(MOE_ARCHITECTURES)}), not arch={arch!r}"
        )
    return moe, intermediate_size


def _classes(arch: str) -> tuple[Any, Any]:
    """transformers' config and causal-LM classes of ``arch``."""
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MixtralConfig,
        MixtralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
    )

    return {
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM),
        "mixtral": (MixtralConfig, MixtralForCausalLM),
    }[arch]


def build_tiny_model(
    tokenizer: PreTrainedTokenizerBase,
    *,
    arch: str = "qwen2",
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 8,
    num_kv_heads: int = 4,
    intermediate_size: int = 256,
    max_position_embeddings: int = 64,
    tie_word_embeddings: bool = True,
    num_experts: int = 0,
    num_experts_per_tok: int = 2,
    moe_intermediate_size: int = 0,
    seed: int = 0,
) -> PreTrainedModel:
    """A randomly initialised fp32 causal LM of architecture ``arch`` for ``tokenizer``.

    The vocabulary size and the pad/eos/bos ids come from the tokenizer. The MoE architectures
    (``MOE_ARCHITECTURES``) take ``num_experts``, ``num_experts_per_tok`` and
    ``moe_intermediate_size`` (each expert's width; 0 means ``intermediate_size``).
    """
    import torch

    _check_shape(arch, hidden_size, num_heads, num_kv_heads)
    moe, intermediate_size = _moe_kwargs(arch, num_experts=num_experts, num_experts_per_tok=num_experts_per_tok,
                                         moe_intermediate_size=moe_intermediate_size,
                                         intermediate_size=intermediate_size, head_dim=hidden_size // num_heads)
    config_cls, model_cls = _classes(arch)
    config = config_cls(
        **moe,
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config)
    model = model.to(torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model


def count_parameters(model: PreTrainedModel) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def tiny_preset(name: str) -> dict[str, Any]:
    """A copy of the keyword arguments of preset ``name`` (see ``TINY_PRESETS``)."""
    if name not in TINY_PRESETS:
        raise ValueError(
            f"unknown tiny model preset {name!r}; valid: {', '.join(sorted(TINY_PRESETS))}"
        )
    return dict(TINY_PRESETS[name])
