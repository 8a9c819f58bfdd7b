"""The PPO-style losses of one micro-batch, composed from registered pieces: the actor's (policy
loss, entropy bonus, KL penalty) and the critic's (clipped value loss), aggregated with global
denominators.

Pure functions of tensors: the roles call them from inside the engines' train steps. ``denominator``
is the global count ``agg_loss`` divides by (``agg_denominator`` summed over the mini-batch's
micro-batches and data-parallel ranks), so summing the returned losses over micro-batches and
ranks gives the single-process loss of the mini-batch. Reported stats are per token (rescaled from
the global denominator to this micro-batch's own count), for readable metrics.

Shape letters: T flat response tokens, B1 rows + 1 (offsets).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from torch import Tensor

from flowrl.algos import agg_denominator, agg_loss, value_loss
from flowrl.catalog import metric_names as names
from flowrl.catalog.algos import AGG_MODES

__all__ = ["ActorLoss", "actor_loss", "critic_loss"]


@dataclass(frozen=True, kw_only=True)
class ActorLoss:
    """How the actor's loss is composed: the policy loss and KL estimator functions (registered
    in ``flowrl.algos``), the aggregation ``mode`` and the coefficients of an actor config."""

    policy_loss: Callable[..., tuple[Tensor, dict[str, Tensor]]]
    kl_estimator: Callable[[Tensor, Tensor], Tensor]
    mode: str
    max_response_length: int
    use_old_logprobs: bool
    clip_ratio_low: float
    clip_ratio_high: float
    clip_ratio_c: float
    entropy_coeff: float
    use_kl_loss: bool
    kl_loss_coef: float


def _scale(denominator: float, fields: Mapping[str, Tensor], response_cu_B1: Tensor, mode: str) -> float:
    """Global-to-local rescaling of a reported stat (per token, not per global count); 1 for
    ``token-sum``, whose stat is the micro-batch's sum."""
    if AGG_MODES.traits(mode)["counts"] == "nothing":
        return 1.0
    return denominator / max(agg_denominator(fields["response_mask"], response_cu_B1, mode), 1.0)


def actor_loss(logp_T: Tensor, entropy_T: Tensor | None, fields: Mapping[str, Tensor], response_cu_B1: Tensor,
               *, spec: ActorLoss, denominator: float) -> tuple[Tensor, dict[str, Any]]:
    """``(loss, stats)`` of one micro-batch: the aggregated policy loss, minus ``entropy_coeff``
    times the aggregated entropy (when entropies are given and the coefficient is non-zero), plus
    ``kl_loss_coef`` times the aggregated KL to ``ref_logprobs`` (``use_kl_loss``).

    ``fields``: the micro-batch's token fields (``advantages``, ``response_mask``, and
    ``old_logprobs`` / ``ref_logprobs`` when used). ``stats``: the policy loss's own stats
    (detached), ``pg_loss``, ``entropy`` (with entropies) and ``kl_loss`` (``use_kl_loss``)."""
    mode = spec.mode

    def agg(x_T: Tensor) -> Tensor:
        return agg_loss(x_T, fields["response_mask"], response_cu_B1, mode, denominator=denominator,
                        max_response_length=spec.max_response_length)

    old_T = fields["old_logprobs"] if spec.use_old_logprobs else logp_T.detach()
    pg_T, stats = spec.policy_loss(
        logp_T, old_T, fields["advantages"], fields["response_mask"], response_cu_B1,
        clip_ratio_low=spec.clip_ratio_low, clip_ratio_high=spec.clip_ratio_high, clip_ratio_c=spec.clip_ratio_c,
    )
    pg_loss = agg(pg_T)
    loss = pg_loss
    out = {k: v.detach() for k, v in stats.items()}
    scale = _scale(denominator, fields, response_cu_B1, mode)
    out[names.PG_LOSS] = pg_loss.detach() * scale
    if entropy_T is not None:
        entropy = agg(entropy_T)
        out[names.ENTROPY] = entropy.detach() * scale
        if spec.entropy_coeff:
            loss = loss - spec.entropy_coeff * entropy
    if spec.use_kl_loss:
        kl = agg(spec.kl_estimator(logp_T, fields["ref_logprobs"]))
        loss = loss + spec.kl_loss_coef * kl
        out[names.KL_LOSS] = kl.detach() * scale
    return loss, out


def critic_loss(vpreds_T: Tensor, fields: Mapping[str, Tensor], response_cu_B1: Tensor, *, mode: str,
                cliprange_value: float, max_response_length: int, denominator: float) -> tuple[Tensor, dict[str, Any]]:
    """``(loss, stats)`` of one micro-batch of the critic: the clipped value loss of the
    predictions ``vpreds_T`` against ``returns`` around ``values`` (``fields``), aggregated;
    ``stats``: ``vf_loss`` (per token) and the value loss's own stats."""
    loss_T, stats = value_loss(vpreds_T, fields["values"], fields["returns"], fields["response_mask"],
                               cliprange_value=cliprange_value)
    loss = agg_loss(loss_T, fields["response_mask"], response_cu_B1, mode, denominator=denominator,
                    max_response_length=max_response_length)
    return loss, {names.VF_LOSS: loss.detach() * _scale(denominator, fields, response_cu_B1, mode), **stats}
