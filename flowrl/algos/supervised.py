"""What a supervised loss (SFT, DPO, a reward model's) declares, so that one role method trains
any of them on every train backend: the token fields it reads, the count it normalises by
(summed over a mini-batch's micro-batches and the data-parallel ranks, as the PPO losses'
``agg_denominator``) and its per-micro-batch function.

Pure: no torch import here (the loss modules import it); the policy role calls
:meth:`SupervisedLoss.count` per mini-batch, all-reduces it, then the engine's ``train_step``
calls :attr:`SupervisedLoss.fn` per micro-batch.

Shape letters: T flat response tokens, B1 rows + 1 (offsets).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["SupervisedLoss", "Totals", "mean_stat"]


@dataclass(frozen=True)
class Totals:
    """A mini-batch's global counts (every micro-batch, every data-parallel rank): ``denominator``
    what the loss divides by (tokens, pairs), ``num_tokens`` its response tokens (the weight the
    engines average stats by)."""

    denominator: float
    num_tokens: float


@dataclass(frozen=True, kw_only=True)
class SupervisedLoss:
    """A loss of one micro-batch, normalised by a global count so that summing it over
    micro-batches and ranks gives the single-process loss of the mini-batch.

    ``fn(value_T, fields, response_cu_B1, *, totals, **options) -> (loss, stats)``: ``value_T`` the
    micro-batch's response-token log-probs (or the reward model's scores, one per row);
    ``count(fields, response_cu_B1) -> float`` this micro-batch's share of ``totals.denominator``."""

    name: str
    fields: tuple[str, ...]
    """Token columns of the table the loss reads (``response_mask``, ``ref_logprobs``)."""
    count: Callable[[Mapping[str, "Tensor"], "Tensor"], float]
    fn: Callable[..., tuple["Tensor", dict[str, Any]]]
    pairs: bool = False
    """Rows come in (chosen, rejected) pairs, adjacent: micro-batches must hold whole pairs."""


def mean_stat(total_x: "Tensor | float", num_tokens_mb: int, totals: Totals) -> float:
    """A stat whose mean over the mini-batch is ``sum(x) / denominator`` reported through an
    engine that averages stats weighted by each micro-batch's response tokens:
    ``sum_x_mb * N / (D * n_mb)`` averages (weights ``n_mb / N``) to ``sum(x) / D``."""
    value = float(total_x)
    return value * totals.num_tokens / (max(totals.denominator, 1.0) * max(num_tokens_mb, 1))
