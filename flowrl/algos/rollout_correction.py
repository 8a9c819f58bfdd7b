"""Rollout correction: importance weights between the trainer's and the rollout's policy.

The rollout's tokens were sampled by ``pi_rollout`` (another engine's numerics, or, with
``trainer.staleness`` > 0, weights some versions behind); the update's pre-update log-probs are
``pi_old``'s. Per verl (``algorithm.rollout_is*``, its rollout-correction helper):

    log_ratio_T = clamp(old_logp - rollout_logp, ±20)
    token:      w_T = exp(log_ratio_T)
    sequence:   w_T = exp(sum over the row's valid tokens of log_ratio)       (clamped ±20 as a sum)
    geometric:  w_T = exp(mean over the row's valid tokens of log_ratio)
    truncate (TIS):  weights = min(w, upper)                  (the response mask is unchanged)
    mask (MIS):      weights = w; tokens (token level) or rows (sequence levels) with w outside
                     [lower, upper] leave the response mask (lower defaults to 1 / upper)
    veto:            a row with any token ratio < veto_threshold leaves the response mask

The policy loss multiplies its per-token term by ``weights`` (detached), verl's
``pg_losses * rollout_is_weights``. flowrl's registered policy losses are positively homogeneous
in the advantages (``loss(w * A) == w * loss(A)`` for ``w > 0``: PPO clip with the dual clip,
GSPO, GPG; GMPO's ``geo_mean`` for a weight constant over the row, so the config refuses it with
token-level weights), so :func:`apply_to_advantages` applies the weights as ``w * A``; a weight of
exactly 1 leaves every advantage bitwise unchanged. verl 0.9.1's keys
(``algorithm.rollout_correction.rollout_is`` / ``rollout_is_threshold``, decoupled mode) map here.

Metrics (``rollout_corr/*``) are computed from the weights before truncation or masking, over
the valid tokens (verl's definitions): ``kl`` = mean(rollout_logp - old_logp) (KL(rollout ||
old)), ``k3_kl`` = mean(exp(r) - r - 1) with r = old_logp - rollout_logp, ``rollout_is_mean`` /
``_max`` / ``_min``, ``rollout_is_ratio_fraction_high`` / ``_low`` (outside the thresholds),
``rollout_is_masked_fraction`` (tokens that left the mask), ``rollout_is_veto_fraction`` (rows).

Shape letters: T flat response tokens of all rows, B rows, B1 row offsets (see aggregate.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from flowrl.algos.aggregate import masked_mean, segment_ids, segment_sum
from flowrl.catalog import metric_names as names

__all__ = ["RolloutCorrection", "apply_to_advantages", "rollout_importance_weights"]

LOG_RATIO_BOUND = 20.0
"""Log-ratios (token and sequence) are clamped to ±this before ``exp`` (verl's safety bound)."""


@dataclass(frozen=True, kw_only=True)
class RolloutCorrection:
    """The settings of ``algorithm.rollout_is*`` (verl's names)."""

    threshold: float
    threshold_lower: float | None = None
    level: str = "token"  # token | sequence | geometric
    mode: str = "truncate"  # truncate | mask
    veto_threshold: float | None = None

    @property
    def lower(self) -> float:
        return self.threshold_lower if self.threshold_lower is not None else 1.0 / self.threshold


def _level_log_weights(log_ratio_T: Tensor, keep_T: Tensor, cu_seqlens_B1: Tensor, level: str) -> Tensor:
    """Per-token log-weights of ``level`` (the sequence levels broadcast to the row's tokens)."""
    if level == "token":
        return log_ratio_T
    masked_T = torch.where(keep_T, log_ratio_T, 0)
    sums_B = segment_sum(masked_T, cu_seqlens_B1)
    if level == "sequence":
        per_row_B = torch.clamp(sums_B, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    elif level == "geometric":
        per_row_B = sums_B / segment_sum(keep_T.to(log_ratio_T.dtype), cu_seqlens_B1).clamp(min=1)
    else:
        raise ValueError(f"rollout_is_level must be token, sequence or geometric, got {level!r}")
    return per_row_B[segment_ids(cu_seqlens_B1, log_ratio_T.numel())]


def rollout_importance_weights(old_logp_T: Tensor, rollout_logp_T: Tensor, response_mask_T: Tensor,
                               cu_seqlens_B1: Tensor, spec: RolloutCorrection) -> tuple[Tensor, Tensor, dict[str, float]]:
    """``(weights_T, response_mask_T, metrics)``: the importance weights to apply (0 on padding),
    the response mask with the mask mode's and the veto's rejections, and ``rollout_corr/*``."""
    if spec.mode not in ("truncate", "mask"):
        raise ValueError(f"rollout_is_mode must be truncate or mask, got {spec.mode!r}")
    keep_T = response_mask_T.bool()
    old_T, rollout_T = old_logp_T.to(torch.float32), rollout_logp_T.to(torch.float32)
    log_ratio_T = torch.clamp(old_T - rollout_T, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    w_T = torch.exp(_level_log_weights(log_ratio_T, keep_T, cu_seqlens_B1, spec.level))
    high_T, low_T = w_T > spec.threshold, w_T < spec.lower
    new_keep_T = keep_T
    if spec.mode == "truncate":
        weights_T = torch.clamp(w_T, max=spec.threshold)
    else:
        weights_T = w_T
        new_keep_T = new_keep_T & ~high_T & ~low_T
    num_rows = cu_seqlens_B1.numel() - 1
    vetoed_B = torch.zeros(num_rows, dtype=torch.bool)
    if spec.veto_threshold is not None:
        bad_T = keep_T & (torch.exp(log_ratio_T) < spec.veto_threshold)
        vetoed_B = segment_sum(bad_T.to(torch.float32), cu_seqlens_B1) > 0
        new_keep_T = new_keep_T & ~vetoed_B[segment_ids(cu_seqlens_B1, w_T.numel())]
    weights_T = torch.where(keep_T, weights_T, 0)
    metrics = _metrics(log_ratio_T, w_T, keep_T, new_keep_T, high_T, low_T, vetoed_B)
    return weights_T, new_keep_T.to(response_mask_T.dtype), metrics


def _metrics(log_ratio_T: Tensor, w_T: Tensor, keep_T: Tensor, new_keep_T: Tensor, high_T: Tensor, low_T: Tensor,
             vetoed_B: Tensor) -> dict[str, float]:
    """verl's mismatch metrics over the valid tokens (before truncation and masking)."""
    if not bool(keep_T.any()):
        return {}
    w = w_T[keep_T]
    r = log_ratio_T[keep_T]
    return {
        names.ROLLOUT_CORR_KL: float((-r).mean()),
        names.ROLLOUT_CORR_K3_KL: float((torch.exp(r) - r - 1).mean()),
        names.ROLLOUT_CORR_IS_MEAN: float(w.mean()),
        names.ROLLOUT_CORR_IS_MAX: float(w.max()),
        names.ROLLOUT_CORR_IS_MIN: float(w.min()),
        names.ROLLOUT_CORR_FRACTION_HIGH: float(masked_mean(high_T.float(), keep_T)),
        names.ROLLOUT_CORR_FRACTION_LOW: float(masked_mean(low_T.float(), keep_T)),
        names.ROLLOUT_CORR_MASKED_FRACTION: float(masked_mean((keep_T & ~new_keep_T).float(), keep_T)),
        names.ROLLOUT_CORR_VETO_FRACTION: float(vetoed_B.float().mean()) if vetoed_B.numel() else 0.0,
    }


def apply_to_advantages(advantages_T: Tensor, weights_T: Tensor) -> Tensor:
    """``w * A`` on the tokens (the policy losses are positively homogeneous in A, see the module
    docstring); masked tokens keep their advantage (the loss ignores them)."""
    return torch.where(weights_T > 0, advantages_T * weights_T.to(advantages_T.dtype), advantages_T)
