"""Reward-model training engines (the ``rm`` family): a sequence-classification head with one
output on the policy's model family, scored at the last token of ``prompt + response`` (the EOS
of a completion), as :class:`~flowrl.roles.reward_model.RewardModelRole` reads a reward model, so
the trained directory is usable as ``reward_model.model_path``.

``dp``: a replica per rank, gradients reduced once per optimizer step (``dp_policy``); ``fsdp``:
the same model sharded with FSDP2 (``fsdp_reward``). ``flowrl.backends.train.reward`` picks by
``actor.strategy``.

With LoRA (``model.lora_rank`` > 0) peft wraps the model as a sequence classifier (``SEQ_CLS``, as
TRL's reward trainer with a ``peft_config``): adapters on the backbone, the new ``score`` head
trained whole (peft's ``modules_to_save``), everything else frozen; checkpoints hold the adapters
and the head, the export is the merged sequence-classification model.

Shape letters: B rows, L padded length, T response tokens, H hidden.
"""

from __future__ import annotations

from typing import Any

import torch

from flowrl.backends.interfaces import model_kwargs
from flowrl.backends.train.dp_value import TorchDPValueEngine
from flowrl.data.packed import PackedBatch

__all__ = ["HEAD", "TorchDPRewardEngine", "add_reward_adapters", "load_reward_model"]

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

    from flowrl.backends.train.value_head import load_classifier

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


class TorchDPRewardEngine(TorchDPValueEngine):
    """``forward_values`` / ``train_step_values`` of ``dp_value`` with one value per row: the
    score at the row's last token."""

    def _load_model(self, model_dir: str, dtype: torch.dtype) -> torch.nn.Module:
        """The checkpoint's backbone with a one-output sequence-classification head (new: of the
        engine's seed, ``torch.initial_seed()``; or the reward model's own when ``model_dir`` is one)."""
        return load_reward_model(model_dir, dtype, seed=torch.initial_seed())

    _classifier_class = "AutoModelForSequenceClassification"

    @staticmethod
    def _classifier_config(model_dir: str):  # noqa: ANN205 - a transformers config
        return reward_config(model_dir)

    def _add_adapters(self, lora: dict | None) -> None:
        """With ``lora``: peft's adapters as a sequence classifier, the ``score`` head trained whole."""
        if lora:
            self.lora, self.peft_model = add_reward_adapters(self.model, lora)

    def _values(self, mb: PackedBatch) -> torch.Tensor:
        """The score of each row (B): the head at the position of its last response token."""
        padded, dev = mb.model_inputs(self.pad_id, self.pair_cost), self.device
        self.slots_computed += padded.num_slots
        hidden_BLH = self.model.base_model(**model_kwargs(padded, dev, self.model.config._attn_implementation)).last_hidden_state
        last_B = mb.response_cu_B1[1:] - 1  # every row has a response (its completion and EOS)
        hidden_BH = hidden_BLH[padded.row_T[last_B].to(dev), padded.pos_T[last_B].to(dev)]
        return self.model.score(hidden_BH)[:, 0].float().cpu()

