"""Reward-model training: the Bradley-Terry loss of (chosen, rejected) pairs on the scalar scores
of a sequence-classification head (one score per row, at its last token)::

    loss = -logsigmoid(r_chosen - r_rejected)        (mean over the mini-batch's pairs)
    accuracy = r_chosen > r_rejected

as TRL's ``RewardTrainer`` (without its margin term) and OpenRLHF's ``PairWiseLoss``.

Shape letters: B rows (adjacent pairs: chosen at even rows), P pairs, B1 rows + 1 (offsets).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch.nn.functional as F
from torch import Tensor

from flowrl.algos.dpo_loss import pair_count
from flowrl.algos.supervised import SupervisedLoss, Totals

__all__ = ["RM_LOSS", "bradley_terry_loss"]

LOSS = "rm_loss"
ACCURACY = "accuracy"
MARGIN = "margin"
CHOSEN = "score/chosen"
REJECTED = "score/rejected"


def bradley_terry_loss(scores_B: Tensor, fields: Mapping[str, Tensor], response_cu_B1: Tensor, *,
                       totals: Totals) -> tuple[Tensor, dict[str, Any]]:
    """The micro-batch's summed pair losses over the global pair count; its stats summed over pairs."""
    assert scores_B.numel() % 2 == 0, f"a reward-model micro-batch holds whole pairs, got {scores_B.numel()} rows"
    chosen_P, rejected_P = scores_B[0::2], scores_B[1::2]
    losses_P = -F.logsigmoid(chosen_P - rejected_P)
    c, r = chosen_P.detach(), rejected_P.detach()
    sums = {LOSS: losses_P.detach().sum(), ACCURACY: (c > r).float().sum(), MARGIN: (c - r).sum(), CHOSEN: c.sum(),
             REJECTED: r.sum()}
    return losses_P.sum() / max(totals.denominator, 1.0), sums


RM_LOSS = SupervisedLoss(name="rm", fields=(), count=pair_count, fn=bradley_terry_loss,
                         stats=(LOSS, ACCURACY, MARGIN, CHOSEN, REJECTED), pairs=True)
