"""LoRA adapters for the vLLM checks (``tests/vllm_env/check_lora.py``, ``tests/gpu/vllm_gpu.py``):
a model with peft adapters of given values, the adapter tensors the trainer's sync sends, and the
merged weights the path without adapters sends."""

from __future__ import annotations

from typing import Any

import torch

from flowrl.models.lora import LoraSpec, add_adapters, is_adapter, merged_weights


def peft_model(model_dir: str, spec: LoraSpec) -> Any:
    """The trainer's model: ``model_dir``'s weights with ``spec``'s adapters (zero B: no change yet)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    add_adapters(model, spec)
    return model


def set_adapters(model: Any, seed: int, scale: float = 0.3) -> dict[str, torch.Tensor]:
    """Give every adapter of ``model`` random values (B != 0, so the outputs change); returns
    them by the trainer's names (``...lora_A.default.weight``)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if is_adapter(name):
                p.copy_(scale * torch.randn(p.shape, generator=gen))
    return {n: p.detach().clone() for n, p in model.named_parameters() if is_adapter(n)}


def merged_state(model: Any) -> dict[str, torch.Tensor]:
    """The merged weights as the trainer sends them (the tied output layer not named)."""
    tied = getattr(model.config, "tie_word_embeddings", False)
    return {k: v for k, v in merged_weights(model, dict(model.state_dict())).items()
            if not (tied and k == "lm_head.weight")}
