"""Supervised fine-tuning: the negative log-likelihood of the assistant tokens only.

A conversation's tokens are one row (``flowrl.data.chat``): its ``response_mask`` is 1 on the
tokens the assistant wrote (and the end-of-turn tokens after them), 0 on the system, user and
tool tokens and on the template's headers. The loss is the token mean over the mini-batch's
masked tokens (verl's SFT ``loss_agg_mode=token-mean``), normalised by the global count.

Shape letters: T flat response tokens, B1 rows + 1 (offsets).
"""

from __future__ import annotations

from typing import Any, Mapping

from torch import Tensor

from flowrl.algos.supervised import SupervisedLoss, Totals

__all__ = ["SFT_LOSS", "sft_count", "sft_loss"]

LOSS = "sft_loss"
"""The stat: mean negative log-likelihood per assistant token (``actor/sft_loss``)."""


def sft_count(fields: Mapping[str, Tensor], response_cu_B1: Tensor) -> float:
    """Assistant tokens of a micro-batch: its share of the denominator."""
    return float(fields["response_mask"].sum())


def sft_loss(logp_T: Tensor, fields: Mapping[str, Tensor], response_cu_B1: Tensor, *,
             totals: Totals) -> tuple[Tensor, dict[str, Any]]:
    """``sum(-logp * mask) / denominator`` over this micro-batch (the mini-batch's token mean
    once summed over micro-batches and ranks); the sum ``sft_loss`` (its mean: the same loss)."""
    mask_T = fields["response_mask"].to(logp_T.dtype)
    nll = -(logp_T * mask_T).sum()
    loss = nll / max(totals.denominator, 1.0)
    return loss, {LOSS: nll.detach()}


def held_out_loss(logp_T: Tensor, mask_T: Tensor) -> float:
    """Validation: the mean negative log-likelihood per assistant token of a whole table."""
    mask_T = mask_T.to(logp_T.dtype)
    return float(-(logp_T * mask_T).sum() / mask_T.sum().clamp(min=1))


SFT_LOSS = SupervisedLoss(name="sft", fields=("response_mask",), count=sft_count, fn=sft_loss, stats=(LOSS,))
