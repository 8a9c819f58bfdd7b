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

Bypass mode (verl's ``algorithm.rollout_correction.bypass_mode=true``: two policies, not three):
no pre-update log-prob pass, ``pi_old := pi_rollout``, and the policy loss becomes
:func:`bypass_policy_loss`, which in each micro-batch, from the current ``logp`` and the rollout's
(``log_ratio = logp - rollout_logp``, detached), computes (verl's ``compute_policy_loss_bypass_mode``):

    IS weights (rollout_is = token | sequence; threshold u, or IcePop's lower_upper l_u):
        token:     w_T = exp(clamp(log_ratio_T, ±20)) on valid tokens
        sequence:  w_T = exp(clamp(sum over the row of log_ratio, ±20))
        TIS:       w = min(w, u);   IcePop: w = 0 outside [l, u]
        batch_normalize: w / mean(w) (token level: over the valid tokens; sequence level: over
                         the rows' weights), in this call (verl: its micro-batch, all-reduced over
                         data-parallel ranks; here the micro-batch of this rank)
    rejection sampling (rollout_rs = comma list, rollout_rs_threshold = one spec or one each;
        every option must pass; k1 = -log_ratio, k2 = log_ratio**2 / 2, k3 = exp(lr) - 1 - lr):
        token_k1 in [log l, log u] (``l_u``, or u alone with l = 1/u); token_k2/k3 <= u;
        seq_sum_kN / seq_mean_kN / seq_max_k2|k3: the row's sum / mean / max of kN, the same bounds
    loss_type ppo_clip:   PPO clip with ratio logp - rollout_logp (the weights only as metrics)
    loss_type reinforce:  -A * logp * w (w = 1 with rollout_is null)

Rejected tokens contribute 0 to the loss; the denominator is the mini-batch's valid-token count
before rejection, as verl's ``batch_num_tokens``.

Shape letters: T flat response tokens of all rows, B rows, B1 row offsets (see aggregate.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import math

import torch
from torch import Tensor

from flowrl.algos.aggregate import masked_mean, segment_ids, segment_sum
from flowrl.algos.rollout_thresholds import LOSS_TYPES, RS_OPTIONS, parse_is_threshold, parse_rs_thresholds
from flowrl.catalog import metric_names as names

if TYPE_CHECKING:
    from flowrl.algos.policy_loss import PolicyLossFn

__all__ = ["Bypass", "RolloutCorrection", "apply_to_advantages", "bypass_policy_loss", "is_weights",
           "parse_rs_thresholds", "rejection_keep", "rollout_importance_weights"]

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


# --------------------------------------------------------------------------- bypass mode (verl's)
@dataclass(frozen=True, kw_only=True)
class Bypass:
    """verl's bypass mode settings (``algorithm.rollout_correction.*``, flowrl's
    ``algorithm.rollout_is_*`` / ``rollout_rs*``)."""

    loss_type: str = "ppo_clip"
    level: str | None = None  # token | sequence | None: no IS weights
    threshold: str | float = 2.0  # TIS's upper bound, or IcePop's "lower_upper"
    batch_normalize: bool = False
    rs: str | None = None
    rs_threshold: str | float | None = None

    def __post_init__(self) -> None:
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"rollout_is_loss_type must be one of {LOSS_TYPES}, got {self.loss_type!r}")
        if self.level not in (None, "token", "sequence"):
            raise ValueError(f"bypass mode's rollout_is_level must be token or sequence (verl's), got {self.level!r}")
        parse_is_threshold(self.threshold)
        if self.rs is not None:
            parse_rs_thresholds(self.rs, self.rs_threshold)


def is_weights(log_ratio_T: Tensor, keep_T: Tensor, cu_seqlens_B1: Tensor, *, level: str, threshold: str | float,
               batch_normalize: bool = False) -> tuple[Tensor, dict[str, float]]:
    """verl's ``compute_rollout_correction_weights``: ``(weights_T, metrics)``, 0 on padding."""
    upper, lower = parse_is_threshold(threshold)
    keep_T = keep_T.bool()
    if level == "token":
        raw_T = torch.exp(torch.clamp(log_ratio_T, -LOG_RATIO_BOUND, LOG_RATIO_BOUND))
    elif level == "sequence":
        sums_B = segment_sum(torch.where(keep_T, log_ratio_T, 0), cu_seqlens_B1)
        raw_T = torch.exp(torch.clamp(sums_B, -LOG_RATIO_BOUND, LOG_RATIO_BOUND))[segment_ids(cu_seqlens_B1, keep_T.numel())]
    else:
        raise ValueError(f"rollout_is must be token or sequence, got {level!r}")
    raw_T = torch.where(keep_T, raw_T, 0)
    if lower is None:
        w_T = raw_T.clamp(max=upper)
    else:
        w_T = torch.where((raw_T >= lower) & (raw_T <= upper), raw_T, 0)
    metrics: dict[str, float] = {}
    if bool(keep_T.any()):
        low = lower if lower is not None else 1.0 / upper
        w = w_T[keep_T]
        metrics = {names.ROLLOUT_CORR_IS_MEAN: float(w.mean()), names.ROLLOUT_CORR_IS_MAX: float(w.max()),
                   names.ROLLOUT_CORR_IS_MIN: float(w.min()),
                   names.ROLLOUT_CORR_FRACTION_HIGH: float(masked_mean((raw_T > upper).float(), keep_T)),
                   names.ROLLOUT_CORR_FRACTION_LOW: float(masked_mean((raw_T < low).float(), keep_T))}
    if batch_normalize:
        if level == "token":
            mean = masked_mean(w_T, keep_T)
        else:
            counts_B = segment_sum(keep_T.to(w_T.dtype), cu_seqlens_B1)
            rows_B = counts_B > 0
            per_row_B = segment_sum(w_T, cu_seqlens_B1) / counts_B.clamp(min=1)
            mean = per_row_B[rows_B].sum() / rows_B.sum().clamp(min=1)
        factor = float(mean) if float(mean) > 1e-8 else 1.0
        w_T = w_T / factor
        metrics[names.ROLLOUT_CORR_PREFIX + "rollout_is_batch_norm_factor"] = factor
    return w_T.detach(), metrics


def rejection_keep(log_ratio_T: Tensor, keep_T: Tensor, cu_seqlens_B1: Tensor, rs: str,
                   rs_threshold: str | float) -> tuple[Tensor, dict[str, float]]:
    """verl's ``compute_rollout_rejection_mask``: ``(keep_T, metrics)``, the valid tokens every
    option of ``rs`` passes (a sequence option keeps or drops its whole row)."""
    keep_T = keep_T.bool()
    lr_T = torch.clamp(log_ratio_T, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    k_T = {"k1": -lr_T, "k2": 0.5 * lr_T**2, "k3": torch.exp(lr_T) - 1.0 - lr_T}
    rows_T = segment_ids(cu_seqlens_B1, keep_T.numel())
    counts_B = segment_sum(keep_T.to(lr_T.dtype), cu_seqlens_B1)
    pass_T = torch.ones_like(keep_T)
    metrics: dict[str, float] = {}
    for option, (lower, upper) in parse_rs_thresholds(rs, rs_threshold).items():
        kind = option[-2:]
        stat_T = torch.where(keep_T, k_T[kind], 0)
        if option.startswith("token"):
            value_T = stat_T
        elif option.startswith("seq_sum"):
            value_T = segment_sum(stat_T, cu_seqlens_B1)[rows_T]
        elif option.startswith("seq_mean"):
            value_T = (segment_sum(stat_T, cu_seqlens_B1) / counts_B.clamp(min=1))[rows_T]
        else:  # seq_max
            neg = torch.full_like(stat_T, float("-inf"))
            max_B = torch.full((counts_B.numel(),), float("-inf"), dtype=stat_T.dtype)
            max_B = max_B.scatter_reduce(0, rows_T, torch.where(keep_T, stat_T, neg), reduce="amax")
            value_T = torch.where(torch.isinf(max_B), 0, max_B)[rows_T]
        if kind == "k1":
            ok_T = (value_T >= math.log(lower)) & (value_T <= math.log(upper))
        else:
            ok_T = value_T <= upper
        pass_T = pass_T & ok_T
        metrics[f"{names.ROLLOUT_CORR_PREFIX}rollout_rs_{option}_masked_fraction"] = float(
            masked_mean((~ok_T).float(), keep_T))
    new_keep_T = keep_T & pass_T
    metrics[names.ROLLOUT_CORR_PREFIX + "rollout_rs_masked_fraction"] = float(masked_mean((~pass_T).float(), keep_T))
    rejected_B = segment_sum((keep_T & ~pass_T).float(), cu_seqlens_B1) > 0
    metrics[names.ROLLOUT_CORR_PREFIX + "rollout_rs_seq_masked_fraction"] = (
        float(rejected_B.float().mean()) if rejected_B.numel() else 0.0)
    return new_keep_T, metrics


def bypass_policy_loss(logp_T: Tensor, rollout_logp_T: Tensor, advantages_T: Tensor, response_mask_T: Tensor,
                       cu_seqlens_B1: Tensor, *, bypass: Bypass, clip_ratio_low: float = 0.2,
                       clip_ratio_high: float = 0.2, clip_ratio_c: float = 3.0) -> tuple[Tensor, dict[str, Tensor]]:
    """verl's ``compute_policy_loss_bypass_mode`` with flowrl's policy-loss signature (its
    ``old_logp`` is the rollout's): per-token loss, 0 on padding and on rejected tokens; stats
    ``ppo_kl`` (mean of ``rollout_logp - logp``), PPO clip's clip fractions, ``rollout_corr/*``."""
    from flowrl.algos.policy_loss import vanilla_policy_loss

    keep_T = response_mask_T.bool()
    with torch.no_grad():
        dtype = torch.promote_types(logp_T.dtype, torch.float32)  # at least fp32 (bf16 log-probs)
        log_ratio_T = logp_T.detach().to(dtype) - rollout_logp_T.to(dtype)
        weights_T, metrics = None, {}
        if bypass.level is not None:
            weights_T, metrics = is_weights(log_ratio_T, keep_T, cu_seqlens_B1, level=bypass.level,
                                            threshold=bypass.threshold, batch_normalize=bypass.batch_normalize)
        if bypass.rs is not None:
            keep_T, rs_metrics = rejection_keep(log_ratio_T, keep_T, cu_seqlens_B1, bypass.rs, bypass.rs_threshold)
            metrics.update(rs_metrics)
    if bypass.loss_type == "reinforce":
        loss_T = -advantages_T * logp_T
        if weights_T is not None:
            loss_T = loss_T * weights_T.to(loss_T.dtype)
        stats = {names.PPO_KL: masked_mean(-(logp_T.detach() - rollout_logp_T), keep_T).detach()}
        loss_T = torch.where(keep_T, loss_T, 0)
    else:  # ppo_clip: the ratio to the rollout policy is the correction; the weights are metrics only
        loss_T, stats = vanilla_policy_loss(logp_T, rollout_logp_T, advantages_T, keep_T, cu_seqlens_B1,
                                            clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high,
                                            clip_ratio_c=clip_ratio_c)
    return loss_T, {**stats, **{k: torch.tensor(v) for k, v in metrics.items()}}


def bypass_loss_fn(settings: dict) -> "PolicyLossFn":
    """The policy loss of bypass mode from its settings (``Bypass``'s fields, as the actor role
    receives them): ``fn(logp, rollout_logp, advantages, mask, cu, **clip)``."""
    from functools import partial

    return partial(bypass_policy_loss, bypass=Bypass(**settings))
