"""Pre-flight of LoRA (``model.lora_rank`` > 0) for the train backends that build it (``dp``,
``fsdp``: the ``lora`` trait in :mod:`flowrl.backends.registry`): the adapters' target modules
exist in the model, checked on a model built on the meta device (no weights read), before any
worker starts. The adapters themselves: :mod:`flowrl.models.lora`, injected by the engines
(``TorchDPEngine._add_adapters``)."""

from __future__ import annotations

import os
from typing import Any

from flowrl.config import ConfigError

__all__ = ["check_lora", "linear_module_names"]


def linear_module_names(model_path: str) -> set[str]:
    """Last name parts of the model's linear layers (``q_proj``, ``c_attn``, ``lm_head``, ...),
    from its ``config.json`` on the meta device."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.pytorch_utils import Conv1D

    config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, (torch.nn.Linear, Conv1D))}


def check_lora(cfg: Any, *, model_path: str | None) -> None:
    """``model.target_modules`` names linear layers of the model in ``model_path`` (``all-linear``
    always does); raises :class:`~flowrl.config.ConfigError` naming the missing ones."""
    from flowrl.models.lora import LoraSpec

    spec = LoraSpec.from_config(cfg.model)
    if isinstance(spec.target_modules, str) or not model_path or not os.path.isfile(os.path.join(model_path, "config.json")):
        return
    have = linear_module_names(model_path)
    missing = [t for t in spec.target_modules if t not in have]
    if missing:
        raise ConfigError("model.target_modules", cfg.model.target_modules,
                          f"names no linear layer of {model_path}: {', '.join(missing)}",
                          f"use all-linear, or some of: {', '.join(sorted(have))}")
