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

import torch

from flowrl.backends.interfaces import model_kwargs
from flowrl.backends.train.dp_value import TorchDPValueEngine
from flowrl.data.packed import PackedBatch
from flowrl.models.reward_model import HEAD, add_reward_adapters, load_reward_model, reward_config

__all__ = ["HEAD", "TorchDPRewardEngine", "add_reward_adapters", "load_reward_model"]


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

