"""The critic's loss and diagnostics: clipped value loss and explained variance.

Numbers follow verl's ``compute_value_loss`` and ``compute_data_metrics`` (see notes/peers.md).

Shape letters: T = tokens of all rows together.
"""

from __future__ import annotations

import torch
from torch import Tensor

from flowrl.algos.aggregate import masked_mean
from flowrl.catalog import metric_names as names

__all__ = ["explained_variance", "value_loss"]

EXPLAINED_VAR_EPSILON = 1e-5


def value_loss(
    vpreds_T: Tensor, old_values_T: Tensor, returns_T: Tensor, response_mask_T: Tensor, *, cliprange_value: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token clipped value loss ``0.5 * max((v - R)^2, (clip(v, v_old ± eps) - R)^2)``.

    ``v`` are the critic's predictions being trained, ``v_old`` the values the advantages were
    computed with, ``R`` the returns. The clip keeps one update from moving a value further than
    ``cliprange_value`` from ``v_old`` (PPO's value clipping). Aggregate ``loss_T`` with
    ``agg_loss``; 0 on masked tokens. ``stats``: ``vf_clipfrac`` (share of valid tokens where the
    clipped branch is the larger) and ``vpred_mean``, detached masked means.
    """
    if cliprange_value <= 0:
        raise ValueError(f"cliprange_value must be > 0, got {cliprange_value}; verl's default is 0.5")
    keep_T = response_mask_T.bool()
    clipped_T = old_values_T + torch.clamp(vpreds_T - old_values_T, -cliprange_value, cliprange_value)
    loss_unclipped_T = (vpreds_T - returns_T).square()
    loss_clipped_T = (clipped_T - returns_T).square()
    loss_T = 0.5 * torch.maximum(loss_unclipped_T, loss_clipped_T)
    stats = {
        names.VF_CLIPFRAC: masked_mean(torch.gt(loss_clipped_T, loss_unclipped_T).float(), keep_T).detach(),
        names.VPRED_MEAN: masked_mean(vpreds_T, keep_T).detach(),
    }
    return torch.where(keep_T, loss_T, 0), stats


def explained_variance(values_T: Tensor, returns_T: Tensor, response_mask_T: Tensor) -> float:
    """``1 - Var(R - v) / (Var(R) + 1e-5)`` over the valid tokens, Bessel variances, as verl.

    1 is a perfect critic, 0 no better than a constant, negative worse; ``nan`` with fewer than
    two valid tokens.
    """
    keep_T = response_mask_T.bool()
    if int(keep_T.sum()) < 2:
        return float("nan")
    ret_T = returns_T[keep_T].double()
    err_T = ret_T - values_T[keep_T].double()
    return float(1.0 - err_T.var() / (ret_T.var() + EXPLAINED_VAR_EPSILON))
