"""Policy-gradient losses (PPO clip, GSPO, GMPO, GPG), per token, not aggregated.

Every loss has one signature::

    fn(logp_T, old_logp_T, advantages_T, response_mask_T, cu_seqlens_B1, *,
       clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0) -> (loss_T, stats)

``loss_T`` is the per-token loss, 0 on masked tokens; aggregate it with ``agg_loss``. ``stats`` is
a dict of detached 0-d tensors, means over the valid tokens of this call: ``pg_clipfrac``,
``ppo_kl`` (mean of ``old_logp - logp``) and ``pg_clipfrac_lower``. Numbers follow verl's
``compute_policy_loss_vanilla``, ``_gspo``, ``_geo_mean`` and ``_gpg``. The names are registered in
``POLICY_LOSSES`` (``flowrl/catalog/algos.py``).

Shape letters: T = tokens of all rows together, B = rows, B1 = B + 1 offsets (see aggregate.py).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from flowrl.algos.aggregate import masked_mean, segment_ids, segment_sum
from flowrl.catalog import metric_names as names

__all__ = ["PolicyLossFn", "geo_mean_policy_loss", "gpg_policy_loss", "gspo_policy_loss", "vanilla_policy_loss"]

PolicyLossFn = Callable[..., tuple[Tensor, dict[str, Tensor]]]


def _stats(clipfrac: Tensor, ppo_kl: Tensor, clipfrac_lower: Tensor) -> dict[str, Tensor]:
    return {
        names.PG_CLIPFRAC: clipfrac.detach(),
        names.PPO_KL: ppo_kl.detach(),
        names.PG_CLIPFRAC_LOWER: clipfrac_lower.detach(),
    }


def vanilla_policy_loss(
    logp_T: Tensor,
    old_logp_T: Tensor,
    advantages_T: Tensor,
    response_mask_T: Tensor,
    cu_seqlens_B1: Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clip with asymmetric bounds and the dual clip (https://arxiv.org/abs/1912.09729).

    ``ratio = exp(clamp(logp - old_logp, ±20))``;
    ``loss = max(-A * ratio, -A * clip(ratio, 1 - low, 1 + high))``, and where ``A < 0`` also
    ``min(loss, -A * clip_ratio_c)``. ``cu_seqlens_B1`` is unused (token-level loss).
    """
    del cu_seqlens_B1
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1.0 for the dual clip, got {clip_ratio_c}; the default is 3.0")
    keep_T = response_mask_T.bool()
    log_ratio_T = torch.clamp(logp_T - old_logp_T, min=-20.0, max=20.0)
    ratio_T = torch.exp(log_ratio_T)

    loss_unclipped_T = -advantages_T * ratio_T
    loss_clipped_T = -advantages_T * torch.clamp(ratio_T, 1 - clip_ratio_low, 1 + clip_ratio_high)
    loss_ppo_T = torch.maximum(loss_unclipped_T, loss_clipped_T)
    loss_dual_bound_T = -advantages_T * clip_ratio_c
    negative_T = advantages_T < 0
    loss_T = torch.where(negative_T, torch.minimum(loss_dual_bound_T, loss_ppo_T), loss_ppo_T)

    stats = _stats(
        clipfrac=masked_mean(torch.gt(loss_clipped_T, loss_unclipped_T).float(), keep_T),
        ppo_kl=masked_mean(-log_ratio_T, keep_T),
        clipfrac_lower=masked_mean((torch.gt(loss_ppo_T, loss_dual_bound_T) & negative_T).float(), keep_T),
    )
    return torch.where(keep_T, loss_T, 0), stats


def gspo_policy_loss(
    logp_T: Tensor,
    old_logp_T: Tensor,
    advantages_T: Tensor,
    response_mask_T: Tensor,
    cu_seqlens_B1: Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO (https://arxiv.org/abs/2507.18071): one importance ratio per sequence.

    ``s_i = exp(mean over row i's valid tokens of (logp - old_logp))``; each token uses
    ``s_i * exp(logp_t - sg(logp_t))`` (value ``s_i``, gradient through its own logp), with the
    log clamped at 10 above, and the PPO clip without the dual clip (``clip_ratio_c`` is unused).
    verl 0.9.1 aggregates GSPO with the configured ``loss_agg_mode``, as flowrl does (its docs
    recommend ``seq-mean-token-mean``; choose that mode to follow them).
    ``pg_clipfrac_lower`` is 0.
    """
    del clip_ratio_c
    keep_T = response_mask_T.bool()
    log_ratio_T = logp_T - old_logp_T
    tokens_B = segment_sum(keep_T.to(logp_T.dtype), cu_seqlens_B1).clamp(min=1)
    seq_log_ratio_B = segment_sum(torch.where(keep_T, log_ratio_T, 0), cu_seqlens_B1) / tokens_B
    rows_T = segment_ids(cu_seqlens_B1, logp_T.numel())

    log_seq_ratio_T = logp_T - logp_T.detach() + seq_log_ratio_B.detach()[rows_T]
    seq_ratio_T = torch.exp(torch.clamp(log_seq_ratio_T, max=10.0))

    loss_unclipped_T = -advantages_T * seq_ratio_T
    loss_clipped_T = -advantages_T * torch.clamp(seq_ratio_T, 1 - clip_ratio_low, 1 + clip_ratio_high)
    loss_T = torch.maximum(loss_unclipped_T, loss_clipped_T)

    stats = _stats(
        clipfrac=masked_mean(torch.gt(loss_clipped_T, loss_unclipped_T).float(), keep_T),
        ppo_kl=masked_mean(-log_ratio_T, keep_T),
        clipfrac_lower=logp_T.new_zeros(()),
    )
    return torch.where(keep_T, loss_T, 0), stats


def geo_mean_policy_loss(
    logp_T: Tensor,
    old_logp_T: Tensor,
    advantages_T: Tensor,
    response_mask_T: Tensor,
    cu_seqlens_B1: Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GMPO (https://arxiv.org/abs/2507.20673), verl's ``geo_mean``: the geometric mean of the
    token ratios, each clipped in log space, times the row's mean advantage.

    Per token ``d = logp - old_logp`` (no clamp, as verl), ``d_c = clip(d, -low, +high)`` and
    ``d' = sgn(A) * min(sgn(A) * d, sgn(A) * d_c)``; per row ``r_i = exp(mean of d')`` and
    ``loss_i = -mean(A) * r_i`` (means over the row's valid tokens). verl returns ``mean_i loss_i``
    whatever ``loss_agg_mode`` says; flowrl spreads ``loss_i`` over the row's valid tokens as
    ``loss_i / n_i``, so ``seq-mean-token-sum`` gives verl's number exactly and ``token-mean`` (what
    verl's GMPO examples write) verl's gradient times rows / tokens (Adam's step is unchanged
    by that scale; a fully masked row counts in verl's mean, not in flowrl's).
    ``pg_clipfrac`` / ``pg_clipfrac_lower``: tokens with ``d != d_c`` and ``A > 0`` / ``A < 0``.
    ``clip_ratio_c`` is unused.
    """
    del clip_ratio_c
    keep_T = response_mask_T.bool()
    log_ratio_T = logp_T - old_logp_T
    clamped_T = torch.clamp(log_ratio_T, -clip_ratio_low, clip_ratio_high)
    sign_T = torch.sign(advantages_T)
    pessimistic_T = sign_T * torch.minimum(sign_T * log_ratio_T, sign_T * clamped_T)

    tokens_B = segment_sum(keep_T.to(logp_T.dtype), cu_seqlens_B1)
    seq_log_ratio_B = segment_sum(torch.where(keep_T, pessimistic_T, 0), cu_seqlens_B1) / (tokens_B + 1e-8)
    seq_adv_B = segment_sum(torch.where(keep_T, advantages_T, 0), cu_seqlens_B1) / (tokens_B + 1e-8)
    loss_B = -seq_adv_B * torch.exp(seq_log_ratio_B)
    rows_T = segment_ids(cu_seqlens_B1, logp_T.numel())
    loss_T = (loss_B / tokens_B.clamp(min=1))[rows_T]

    clipped_T = torch.ne(log_ratio_T, clamped_T)
    stats = _stats(
        clipfrac=masked_mean((clipped_T & (advantages_T > 0)).float(), keep_T),
        ppo_kl=masked_mean(-log_ratio_T, keep_T),
        clipfrac_lower=masked_mean((clipped_T & (advantages_T < 0)).float(), keep_T),
    )
    return torch.where(keep_T, loss_T, 0), stats


def gpg_policy_loss(
    logp_T: Tensor,
    old_logp_T: Tensor,
    advantages_T: Tensor,
    response_mask_T: Tensor,
    cu_seqlens_B1: Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GPG (https://arxiv.org/abs/2504.02546), verl's ``gpg``: plain REINFORCE, ``-logp * A`` per
    token, aggregated with ``loss_agg_mode`` as verl does. No ratio and no clip: ``old_logp_T``
    and the clip keywords are unused. verl reports no stats; flowrl reports ``ppo_kl`` (the mean
    of ``old_logp - logp``) and clip fractions of 0, so the metric names stay the same."""
    del cu_seqlens_B1, clip_ratio_low, clip_ratio_high, clip_ratio_c
    keep_T = response_mask_T.bool()
    zero = logp_T.new_zeros(())
    stats = _stats(clipfrac=zero, ppo_kl=masked_mean((old_logp_T - logp_T).detach(), keep_T), clipfrac_lower=zero)
    return torch.where(keep_T, -logp_T * advantages_T, 0), stats
