"""Direct preference optimisation: the sigmoid (DPO) and IPO losses of (chosen, rejected) pairs,
as TRL's ``DPOTrainer`` computes them, with its metrics.

Rows come in adjacent pairs (``flowrl.data.pairs``: chosen at even rows, rejected after it), the
response tokens of a row are its completion. With the sequence log-probs ``pi`` of the policy
and ``ref`` of the frozen reference (summed over the completion; IPO: averaged over it, as TRL)::

    logits   = (pi_c - pi_r) - (ref_c - ref_r)
    sigmoid: loss = -logsigmoid(beta * logits) * (1 - eps) - logsigmoid(-beta * logits) * eps
    ipo:     loss = (logits - 1 / (2 * beta)) ** 2
    rewards/chosen = beta * (pi_c - ref_c), rewards/rejected = beta * (pi_r - ref_r)
    rewards/margins = chosen - rejected, rewards/accuracies = chosen > rejected

The loss is the mean over the mini-batch's pairs (normalised by the global pair count).

Shape letters: T flat response tokens, B rows, P pairs (B = 2P), B1 rows + 1 (offsets).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch.nn.functional as F
from torch import Tensor

from flowrl.algos.aggregate import segment_sum
from flowrl.algos.supervised import SupervisedLoss, Totals

__all__ = ["DPO_LOSS", "DPO_LOSS_TYPES", "dpo_loss", "dpo_pair_losses", "pair_count", "sequence_logps"]

DPO_LOSS_TYPES = ("sigmoid", "ipo")

LOSS = "dpo_loss"
REWARDS_CHOSEN = "rewards/chosen"
REWARDS_REJECTED = "rewards/rejected"
REWARDS_MARGINS = "rewards/margins"
REWARDS_ACCURACIES = "rewards/accuracies"
LOGPS_CHOSEN = "logps/chosen"
LOGPS_REJECTED = "logps/rejected"


def pair_count(fields: Mapping[str, Tensor], response_cu_B1: Tensor) -> float:
    """Pairs in a micro-batch (its share of the denominator)."""
    return float((response_cu_B1.numel() - 1) // 2)


def sequence_logps(logp_T: Tensor, mask_T: Tensor, response_cu_B1: Tensor, *, average: bool) -> Tensor:
    """Each row's log-prob of its completion: the sum over its masked tokens, or (``average``,
    IPO) their mean."""
    mask_T = mask_T.to(logp_T.dtype)
    logp_B = segment_sum(logp_T * mask_T, response_cu_B1)
    if average:
        logp_B = logp_B / segment_sum(mask_T, response_cu_B1).clamp(min=1)
    return logp_B


def dpo_pair_losses(pi_c_P: Tensor, pi_r_P: Tensor, ref_c_P: Tensor, ref_r_P: Tensor, *, beta: float,
                    loss_type: str, label_smoothing: float = 0.0) -> tuple[Tensor, Tensor, Tensor]:
    """TRL's ``dpo_loss``: ``(losses_P, chosen_rewards_P, rejected_rewards_P)``, rewards detached."""
    logits_P = (pi_c_P - pi_r_P) - (ref_c_P - ref_r_P)
    if loss_type == "sigmoid":
        losses_P = (-F.logsigmoid(beta * logits_P) * (1 - label_smoothing)
                    - F.logsigmoid(-beta * logits_P) * label_smoothing)
    elif loss_type == "ipo":
        losses_P = (logits_P - 1 / (2 * beta)) ** 2
    else:
        raise ValueError(f"algorithm.dpo.loss_type={loss_type!r} is not a DPO loss; use one of {', '.join(DPO_LOSS_TYPES)}")
    return losses_P, beta * (pi_c_P - ref_c_P).detach(), beta * (pi_r_P - ref_r_P).detach()


def dpo_loss(logp_T: Tensor, fields: Mapping[str, Tensor], response_cu_B1: Tensor, *, totals: Totals, beta: float,
             loss_type: str, label_smoothing: float = 0.0) -> tuple[Tensor, dict[str, Any]]:
    """The micro-batch's summed pair losses over the global pair count; TRL's metrics summed over
    the micro-batch's pairs (their means: :func:`flowrl.algos.supervised.means`)."""
    num_rows = response_cu_B1.numel() - 1
    assert num_rows % 2 == 0, f"a DPO micro-batch holds whole (chosen, rejected) pairs, got {num_rows} rows"
    average = loss_type == "ipo"
    mask_T = fields["response_mask"]
    pi_B = sequence_logps(logp_T, mask_T, response_cu_B1, average=average)
    ref_B = sequence_logps(fields["ref_logprobs"], mask_T, response_cu_B1, average=average)
    losses_P, chosen_P, rejected_P = dpo_pair_losses(pi_B[0::2], pi_B[1::2], ref_B[0::2], ref_B[1::2], beta=beta,
                                                     loss_type=loss_type, label_smoothing=label_smoothing)
    loss = losses_P.sum() / max(totals.denominator, 1.0)
    sums = {LOSS: losses_P.detach().sum(), REWARDS_CHOSEN: chosen_P.sum(), REWARDS_REJECTED: rejected_P.sum(),
             REWARDS_MARGINS: (chosen_P - rejected_P).sum(), REWARDS_ACCURACIES: (chosen_P > rejected_P).float().sum(),
             LOGPS_CHOSEN: pi_B[0::2].detach().sum(), LOGPS_REJECTED: pi_B[1::2].detach().sum()}
    return loss, sums


DPO_LOSS = SupervisedLoss(name="dpo", fields=("response_mask", "ref_logprobs"), count=pair_count, fn=dpo_loss,
                          stats=(LOSS, REWARDS_CHOSEN, REWARDS_REJECTED, REWARDS_MARGINS, REWARDS_ACCURACIES,
                                 LOGPS_CHOSEN, LOGPS_REJECTED), pairs=True)
