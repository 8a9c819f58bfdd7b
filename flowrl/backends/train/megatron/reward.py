"""MegatronRewardEngine: the ``rm`` family's reward model on megatron-core (dp x tp x pp).

The value model of :mod:`~flowrl.backends.train.megatron.value` (GPTModel backbone, a replicated
``hidden -> 1`` head where the output layer was) read once per row, at its last token, as the
``dp`` reward model (``flowrl.backends.train.dp_reward``) reads it. The head is
``AutoModelForSequenceClassification(num_labels=1)``'s ``score`` built from the same directory
with the same seed, so a new head starts from the dp engine's numbers, and the export is a
sequence-classification directory (``reward_model.model_path`` in RL).

Megatron's micro-batches feed ``prompt + response`` minus its last token (the last token is only a
label), so the adapter appends one padding token to every response: the real last token is then an
input, and the position that "predicts" the appended token is the real last token's own position,
the last entry of the row's ``index_T``.

Shapes: B = micro-batch rows, S = padded sequence length, H = hidden size.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from flowrl.backends.train.megatron.batching import MicroBatch
from flowrl.backends.train.megatron.value import MegatronValueEngine, MegatronValueTrainEngine
from flowrl.data.packed import PackedBatch

SCORE_PAD = 0
"""The token appended to every response (its own value is never read)."""


def load_hf_reward_model(model_dir: str, *, dtype: torch.dtype, seed: int) -> torch.nn.Module:
    """``AutoModelForSequenceClassification(num_labels=1)`` exactly as the dp reward engine builds
    it: the same seed gives the same new ``score`` head (``value_head.new_head``)."""
    from flowrl.models.reward_model import load_reward_model

    return load_reward_model(model_dir, dtype, seed=seed)


class MegatronRewardEngine(MegatronValueEngine):
    """One rank's share of a megatron-core reward model: a score per row (items whose responses
    end with the appended :data:`SCORE_PAD`), Bradley-Terry train steps, HF sequence-classification
    export."""

    head_bias = False  # AutoModelForSequenceClassification's score

    def _load_hf_model(self) -> torch.nn.Module:
        return load_hf_reward_model(self.model_dir, dtype=torch.float32, seed=self._seed)

    @staticmethod
    def _values(mb: MicroBatch, values_BS1: torch.Tensor) -> torch.Tensor:
        """Each row's score (B): the head at the row's last ``index_T`` entry."""
        last_B = mb.cu_seqlens_B1[1:] - 1
        return values_BS1.reshape(-1).index_select(0, mb.index_T.index_select(0, last_B)).float()

    @torch.no_grad()
    def forward_scores(self, batch: list[dict], *, micro_batch_size: int) -> np.ndarray:
        """One float32 score per item; every tp/pp rank of a dp group passes the same ``batch``."""
        def loss_func(mb, values_BS1):
            scores_B = self._values(mb, values_BS1)
            return scores_B.new_zeros(()), torch.tensor(mb.num_tokens, dtype=torch.int), {
                "mb": mb.index, "scores": scores_B}

        for chunk in self.chunks:
            chunk.eval()
        store = self._run_schedule(batch, micro_batch_size=micro_batch_size, forward_only=True,
                                   loss_func=loss_func)
        scores_B = torch.zeros(len(batch), dtype=torch.float32, device=self.device)
        if store:  # last pipeline stage
            scores_B.copy_(torch.cat([out["scores"] for out in store]))
        return self._from_last_stage(scores_B).cpu().numpy()


def _scored_items(batch: PackedBatch) -> list[dict]:
    """Per-row dicts with :data:`SCORE_PAD` appended to each response (no token fields: the
    Bradley-Terry loss reads scores and row offsets only)."""
    p_cu, r_cu = batch.prompt_cu_B1.tolist(), batch.response_cu_B1.tolist()
    prompt, response = batch.prompt_P.tolist(), batch.response_T.tolist()
    return [{"prompt_ids": prompt[p_cu[i]: p_cu[i + 1]], "response_ids": response[r_cu[i]: r_cu[i + 1]] + [SCORE_PAD]}
            for i in range(batch.num_rows)]


class MegatronRewardTrainEngine(MegatronValueTrainEngine):
    """:class:`MegatronRewardEngine` behind ``TorchDPRewardEngine``'s interface (PackedBatch in,
    one score per row out): ``forward_values``, ``train_step_values``, ``all_reduce_sum``,
    ``hf_state_dict``, ``save_hf``, ``close``."""

    engine_class = MegatronRewardEngine

    def forward_values(self, batch: PackedBatch, *, micro_batch_size: int) -> torch.Tensor:
        if not batch.num_rows:
            return torch.empty(0)
        return torch.from_numpy(self.engine.forward_scores(_scored_items(batch), micro_batch_size=micro_batch_size))

    def train_step_values(self, batch: PackedBatch, *, micro_batch_size: int, loss_fn: Any) -> dict[str, float]:
        """``loss_fn(scores_B, mb)`` with ``mb`` a PackedBatch of the micro-batch's rows (the
        appended token included: only row offsets are read); stats as the critic's."""
        from flowrl.backends.train.megatron.policy import _packed

        def megatron_loss(scores_B, items, cu_seqlens_B1):  # noqa: ANN001, ANN202
            loss, stats = loss_fn(scores_B.cpu(), _packed(items, cu_seqlens_B1, []))
            return loss.to(scores_B.device), stats

        stats = self.engine.train_step_values(_scored_items(batch), micro_batch_size=micro_batch_size,
                                              loss_fn=megatron_loss)
        stats.pop("loss", None)
        return stats
