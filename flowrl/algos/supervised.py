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

__all__ = ["SupervisedLoss", "Totals", "means"]


@dataclass(frozen=True)
class Totals:
    """A mini-batch's global counts (every micro-batch, every data-parallel rank): ``denominator``
    what the loss divides by (assistant tokens, pairs)."""

    denominator: float


@dataclass(frozen=True, kw_only=True)
class SupervisedLoss:
    """A loss of one micro-batch, normalised by a global count so that summing it over
    micro-batches and ranks gives the single-process loss of the mini-batch.

    ``fn(value_T, fields, response_cu_B1, *, totals, **options) -> (loss, sums)``: ``value_T`` the
    micro-batch's response-token log-probs (or the reward model's scores, one per row); ``sums``
    each of :attr:`stats` summed over the micro-batch's tokens or pairs (detached), whose mean over
    the mini-batch is their sum over micro-batches and ranks divided by ``totals.denominator``
    (:func:`means`: the role reduces them itself, whatever an engine does with its stats);
    ``count(fields, response_cu_B1) -> float`` this micro-batch's share of ``totals.denominator``."""

    name: str
    fields: tuple[str, ...]
    """Token columns of the table the loss reads (``response_mask``, ``ref_logprobs``)."""
    count: Callable[[Mapping[str, "Tensor"], "Tensor"], float]
    fn: Callable[..., tuple["Tensor", dict[str, Any]]]
    stats: tuple[str, ...]
    """The names of the sums ``fn`` returns (every rank reduces the same list)."""
    pairs: bool = False
    """Rows come in (chosen, rejected) pairs, adjacent: micro-batches must hold whole pairs."""
    token_stat: Callable[[Mapping[str, Any]], "str | None"] | None = None
    """``token_stat(options)``: the name of a second per-token statistic of the logits ``fn``
    needs with these options (``"uniform_nll"``: label smoothing's, the engines' ``token_stat``),
    passed to ``fn`` as ``<name>_T``; None, or a None result: none."""

    def stat_for(self, options: Mapping[str, Any]) -> "str | None":
        """The per-token statistic ``fn`` needs with ``options`` (None: only the log-probs)."""
        return self.token_stat(options) if self.token_stat is not None else None


def means(sums: Mapping[str, "Tensor | float"], totals: Totals) -> dict[str, float]:
    """Each summed stat over the mini-batch's denominator: its mean per token (or pair)."""
    return {k: float(v) / max(totals.denominator, 1.0) for k, v in sums.items()}
