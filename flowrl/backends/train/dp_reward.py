"""Reward-model training engines (the ``rm`` family): a sequence-classification head with one
output on the policy's model family, scored at the last token of ``prompt + response`` (the EOS
of a completion), as :class:`~flowrl.roles.reward_model.RewardModelRole` reads a reward model, so
the trained directory is usable as ``reward_model.model_path``.

``dp``: a replica per rank, gradients reduced once per optimizer step (``dp_policy``); ``fsdp``:
the same model sharded with FSDP2 (``fsdp_reward``). ``flowrl.backends.train.reward`` picks by
``actor.strategy``.

Shape letters: B rows, L padded length, T response tokens, H hidden.
"""

from __future__ import annotations

import torch

from flowrl.backends.interfaces import model_kwargs
from flowrl.backends.train.dp_value import TorchDPValueEngine
from flowrl.data.packed import PackedBatch

__all__ = ["TorchDPRewardEngine"]


class TorchDPRewardEngine(TorchDPValueEngine):
    """``forward_values`` / ``train_step_values`` of ``dp_value`` with one value per row: the
    score at the row's last token."""

    def _load_model(self, model_dir: str, dtype: torch.dtype) -> torch.nn.Module:
        """The checkpoint's backbone with a one-output sequence-classification head (new, or the
        reward model's own when ``model_dir`` is one)."""
        import transformers
        from transformers import AutoConfig, AutoModelForSequenceClassification

        verbosity = transformers.logging.get_verbosity()
        transformers.logging.set_verbosity_error()  # "score head newly initialised" is the point
        try:
            config = AutoConfig.from_pretrained(model_dir, num_labels=1)
            if config.pad_token_id is None:
                config.pad_token_id = 0  # transformers' own last-token search needs one (we index ourselves)
            return AutoModelForSequenceClassification.from_pretrained(model_dir, config=config, dtype=dtype)
        finally:
            transformers.logging.set_verbosity(verbosity)

    def _values(self, mb: PackedBatch) -> torch.Tensor:
        """The score of each row (B): the head at the position of its last response token."""
        padded, dev = mb.model_inputs(self.pad_id, self.pair_cost), self.device
        self.slots_computed += padded.num_slots
        hidden_BLH = self.model.base_model(**model_kwargs(padded, dev, self.model.config._attn_implementation)).last_hidden_state
        last_B = mb.response_cu_B1[1:] - 1  # every row has a response (its completion and EOS)
        hidden_BH = hidden_BLH[padded.row_T[last_B].to(dev), padded.pos_T[last_B].to(dev)]
        return self.model.score(hidden_BH)[:, 0].float().cpu()

