"""Reductions over ragged rows: segment sums, masked means and loss aggregation.

Experience is ragged. Token-level tensors are flat over all rows concatenated; ``cu_seqlens_B1``
(int64) holds the offsets, so row ``i`` is ``[cu_seqlens_B1[i], cu_seqlens_B1[i + 1])``.

Shape letters: T = tokens of all rows together, B = rows, B1 = B + 1 offsets.

``agg_loss`` takes the *global* count as ``denominator`` so that a step split into micro-batches and
data-parallel ranks adds up to exactly the loss of the whole batch:
``sum over micro-batches and ranks of agg_loss(..., denominator=global_count) == agg_loss(whole batch)``.
The caller computes the local count with ``agg_denominator``, sums it over micro-batches and ranks
(an all-reduce), and passes the result. Gradients are then summed, never averaged, across ranks.

The modes are registered in ``AGG_MODES`` (``flowrl/catalog/algos.py``); each is one function
``mode(masked_T, keep_T, cu_seqlens_B1, max_response_length) -> (total, local count)`` over the
values with masked tokens zeroed, and its trait ``counts`` says what ``agg_denominator`` counts.
"""

from __future__ import annotations

import torch
from torch import Tensor

from flowrl.catalog.algos import AGG_MODES

__all__ = [
    "agg_denominator",
    "agg_loss",
    "masked_mean",
    "segment_ids",
    "segment_sum",
    "seq_mean_token_mean",
    "seq_mean_token_sum",
    "seq_mean_token_sum_norm",
    "token_mean",
    "token_sum",
]


def segment_ids(cu_seqlens_B1: Tensor, num_tokens: int | None = None) -> Tensor:
    """Row index of every token: ``[0, 0, 0, 1, 1, 2, ...]`` (int64, length T)."""
    lengths_B = cu_seqlens_B1[1:] - cu_seqlens_B1[:-1]
    rows_B = torch.arange(lengths_B.numel(), device=cu_seqlens_B1.device)
    if num_tokens is None:
        num_tokens = int(cu_seqlens_B1[-1])
    return torch.repeat_interleave(rows_B, lengths_B, output_size=num_tokens)


def segment_sum(x_T: Tensor, cu_seqlens_B1: Tensor) -> Tensor:
    """Sum of each row's tokens (length B, dtype of ``x_T``); an empty row sums to 0."""
    num_rows = cu_seqlens_B1.numel() - 1
    rows_T = segment_ids(cu_seqlens_B1, x_T.numel())
    return x_T.new_zeros(num_rows).index_add(0, rows_T, x_T)


def masked_mean(x_T: Tensor, mask_T: Tensor) -> Tensor:
    """Mean of ``x_T`` over the tokens where ``mask_T`` is set (0-d); 0 when none is."""
    keep_T = mask_T.bool()
    count = keep_T.sum().clamp(min=1)
    return torch.where(keep_T, x_T, 0).sum() / count


def agg_denominator(response_mask_T: Tensor, cu_seqlens_B1: Tensor, mode: str) -> float:
    """The local count that ``agg_loss`` divides by when ``denominator`` is None.

    Valid tokens for ``token-mean``; rows with at least one valid token for the ``seq-mean-*``
    modes; 0 for ``token-sum``, which divides by nothing. Sum it over micro-batches and ranks to
    get the global ``denominator``.
    """
    counts = AGG_MODES.traits(mode)["counts"]
    if counts == "nothing":
        return 0.0
    keep_T = response_mask_T.bool()
    if counts == "tokens":
        return float(keep_T.sum())
    tokens_B = segment_sum(keep_T.to(torch.int64), cu_seqlens_B1)
    return float((tokens_B > 0).sum())


def token_mean(
    masked_T: Tensor, keep_T: Tensor, cu_seqlens_B1: Tensor, max_response_length: int | None
) -> tuple[Tensor, Tensor]:
    """``token-mean``: the sum of valid token values over the number of valid tokens."""
    return masked_T.sum(), keep_T.sum()


def token_sum(
    masked_T: Tensor, keep_T: Tensor, cu_seqlens_B1: Tensor, max_response_length: int | None
) -> tuple[Tensor, Tensor]:
    """``token-sum``: the sum of valid token values, divided by nothing (verl 0.9's mode; its
    ``* dp_size`` undoes the gradient averaging of DDP/FSDP, and flowrl sums gradients)."""
    return masked_T.sum(), masked_T.new_zeros(())


def _row_sums(masked_T: Tensor, keep_T: Tensor, cu_seqlens_B1: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per row: the sum of its values and its valid tokens; and the number of non-empty rows."""
    sums_B = segment_sum(masked_T, cu_seqlens_B1)
    tokens_B = segment_sum(keep_T.to(masked_T.dtype), cu_seqlens_B1)
    return sums_B, tokens_B, (tokens_B > 0).sum()


def seq_mean_token_sum(
    masked_T: Tensor, keep_T: Tensor, cu_seqlens_B1: Tensor, max_response_length: int | None
) -> tuple[Tensor, Tensor]:
    """``seq-mean-token-sum``: the sum over rows of each row's token sum, over non-empty rows."""
    sums_B, _, local = _row_sums(masked_T, keep_T, cu_seqlens_B1)
    return sums_B.sum(), local


def seq_mean_token_mean(
    masked_T: Tensor, keep_T: Tensor, cu_seqlens_B1: Tensor, max_response_length: int | None
) -> tuple[Tensor, Tensor]:
    """``seq-mean-token-mean``: the sum over rows of each row's token mean, over non-empty rows."""
    sums_B, tokens_B, local = _row_sums(masked_T, keep_T, cu_seqlens_B1)
    return (sums_B / tokens_B.clamp(min=1)).sum(), local


def seq_mean_token_sum_norm(
    masked_T: Tensor, keep_T: Tensor, cu_seqlens_B1: Tensor, max_response_length: int | None
) -> tuple[Tensor, Tensor]:
    """``seq-mean-token-sum-norm`` (Dr.GRPO): ``seq-mean-token-sum`` with each row's sum also
    divided by the constant ``max_response_length``."""
    sums_B, _, local = _row_sums(masked_T, keep_T, cu_seqlens_B1)
    if max_response_length is None or max_response_length <= 0:
        raise ValueError(
            f"loss aggregation mode 'seq-mean-token-sum-norm' needs max_response_length > 0 "
            f"(got {max_response_length!r}); pass the padded response length of the rollout"
        )
    return sums_B.sum() / max_response_length, local


def agg_loss(
    values_T: Tensor,
    response_mask_T: Tensor,
    cu_seqlens_B1: Tensor,
    mode: str,
    *,
    denominator: float | Tensor | None = None,
    max_response_length: int | None = None,
) -> Tensor:
    """Aggregate per-token values into one 0-d loss, as verl's ``agg_loss`` does.

    Masked tokens are ignored (their values may be anything, even NaN).

    - ``token-mean``: sum of valid token values / number of valid tokens.
    - ``token-sum``: sum of valid token values (``denominator`` is ignored).
    - ``seq-mean-token-sum``: sum over rows of the row's token sum / number of non-empty rows.
    - ``seq-mean-token-mean``: sum over rows of the row's token mean / number of non-empty rows.
    - ``seq-mean-token-sum-norm`` (Dr.GRPO): like ``seq-mean-token-sum`` with each row's sum also
      divided by the constant ``max_response_length`` (the padded response length), not by its
      token count. Needs ``max_response_length``; the other modes ignore it.

    Rows without a valid token are skipped by the seq-mean modes. ``denominator`` is the global
    count (see the module docstring); None uses the local one. A denominator of 0 means nothing
    is valid anywhere and gives a loss of 0 that still has a gradient graph.
    """
    reduce = AGG_MODES.get(mode)
    keep_T = response_mask_T.bool()
    total, local = reduce(torch.where(keep_T, values_T, 0), keep_T, cu_seqlens_B1, max_response_length)
    if AGG_MODES.traits(mode)["counts"] == "nothing":
        return total
    if denominator is None:
        denominator = local
    if isinstance(denominator, Tensor):
        denominator = denominator.to(total.dtype)
        return total / torch.where(denominator > 0, denominator, 1)
    if denominator < 0:
        raise ValueError(f"denominator must be a count >= 0, got {denominator!r}")
    return total / (denominator if denominator > 0 else 1.0)
