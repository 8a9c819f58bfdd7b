"""The reward model (the ``rm`` family's): a sequence-classification head with one output on a
causal LM's backbone, built the same way by every engine that trains one
(``flowrl.backends.train.dp_reward`` / ``fsdp_reward`` / ``megatron/reward``) and by the export of
its checkpoints (``flowrl.checkpoint.hf_export``).

With LoRA (``model.lora_rank`` > 0) peft wraps the model as a sequence classifier (``SEQ_CLS``, as
TRL's reward trainer with a ``peft_config``): adapters on the backbone, the new ``score`` head
trained whole (peft's ``modules_to_save``), everything else frozen.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["HEAD", "add_reward_adapters", "load_reward_model", "reward_config"]

HEAD = "score"
"""The sequence-classification head's module name (new: trained whole under LoRA)."""


def reward_config(model_dir: str):  # noqa: ANN201 - a transformers config
    """The reward model's config: one label, a pad id (transformers' own last-token search needs
    one; we index ourselves)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir, num_labels=1)
    if config.pad_token_id is None:
        config.pad_token_id = 0
    return config


def load_reward_model(model_dir: str, dtype: torch.dtype, *, seed: int = 0) -> torch.nn.Module:
    """``AutoModelForSequenceClassification(num_labels=1)`` of ``model_dir``: a causal LM's backbone
    with a new ``score`` head (``value_head.new_head`` of ``seed``), or a reward model's own."""
    from transformers import AutoModelForSequenceClassification

    from flowrl.models.value_head import load_classifier

    return load_classifier(AutoModelForSequenceClassification, model_dir, reward_config(model_dir), dtype=dtype,
                           seed=seed)


def add_reward_adapters(model: torch.nn.Module, lora: dict) -> tuple[Any, Any]:
    """peft's adapters (``lora``: a ``LoraSpec.to_dict()``) in the sequence classifier ``model``,
    in place, as a ``SEQ_CLS`` task with the :data:`HEAD` trained whole; ``(LoraSpec with the head
    in modules_to_save, PeftModel)``. ValueError naming ``model.target_modules`` when none match."""
    from peft import get_peft_model

    from flowrl.models.lora import LoraSpec

    asked = LoraSpec.from_dict(lora)
    spec = asked if HEAD in asked.modules_to_save else LoraSpec.from_dict(
        {**lora, "modules_to_save": [*asked.modules_to_save, HEAD]})
    config = spec.peft_config()
    config.task_type = "SEQ_CLS"  # CAUSAL_LM's wrapper needs generation methods a classifier lacks
    config.ensure_weight_tying = bool(set(asked.modules_to_save) - {HEAD})  # tied embeddings trained whole stay tied
    try:
        peft_model = get_peft_model(model, config)
    except ValueError as exc:
        raise ValueError(f"model.target_modules={spec.to_dict()['target_modules']!r}: {exc}; fix: use "
                         "all-linear or names of the model's linear layers (q_proj, v_proj, ...)") from None
    assert peft_model.base_model.model is model, "peft wrapped a copy of the model"
    return spec, peft_model
