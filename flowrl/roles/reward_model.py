"""A neural reward model: one score per sampled response, from a sequence-classification head.

Holds ``AutoModelForSequenceClassification(num_labels=1)`` (frozen). The score of a row is the
head's output at the last token of ``prompt + response`` (the EOS when the response has one), as
verl's and TRL's reward models read it. The model must share the policy's tokenizer (the token
ids are scored as generated).

Shape letters: B rows, L padded length, H hidden.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch

from flowrl.backends.interfaces import torch_dtype
from flowrl.data.packed import PackedBatch


class RewardModelRole:
    def __init__(self, *, rank: int, world_size: int, model_dir: str, dtype: str = "float32", device: str = "cpu",
                 micro_batch_size: int = 64) -> None:
        """``device``: the rank's; ``dtype``: ``model.dtype`` (``auto``: bf16 on a GPU, fp32 on the
        CPU; frozen, so the weights are held in it)."""
        import transformers
        from transformers import AutoConfig, AutoModelForSequenceClassification

        from flowrl.backends.train.precision import placement

        self.rank = rank
        self.device, precision = placement(device, dtype, trainable=False)
        self.micro_batch_size = micro_batch_size
        config = AutoConfig.from_pretrained(model_dir, num_labels=1)
        verbosity = transformers.logging.get_verbosity()
        transformers.logging.set_verbosity_error()  # a causal-LM directory gets a new head: expected
        try:
            self.model = AutoModelForSequenceClassification.from_pretrained(
                model_dir, config=config, dtype=torch_dtype(precision.param_dtype)).to(self.device)
        finally:
            transformers.logging.set_verbosity(verbosity)
        self.model.eval()
        self.model.requires_grad_(False)
        self.pad_id = config.pad_token_id if config.pad_token_id is not None else 0

    @torch.no_grad()
    def compute_rm_scores(self, table: pa.Table) -> pa.Table:
        """A one-column table: ``rm_score`` (float32) per row of ``table``."""
        batch = PackedBatch.from_table(table)
        scores = [self._score(mb) for mb in batch.micro_batches(self.micro_batch_size)]
        values = torch.cat(scores).numpy().astype(np.float32) if scores else np.zeros(0, np.float32)
        return pa.table({"rm_score": pa.array(values, pa.float32())})

    def _score(self, mb: PackedBatch) -> torch.Tensor:
        padded = mb.padded(self.pad_id)
        ids_BL, mask_BL = padded.input_ids_BL.to(self.device), padded.attention_mask_BL.to(self.device)
        hidden_BLH = self.model.base_model(input_ids=ids_BL, attention_mask=mask_BL).last_hidden_state
        last_B = mask_BL.sum(-1) - 1
        hidden_BH = hidden_BLH[torch.arange(hidden_BLH.shape[0], device=self.device), last_B]
        return self.model.score(hidden_BH)[:, 0].float().cpu()  # scores to the host, for Arrow

    def close(self) -> None:
        pass
